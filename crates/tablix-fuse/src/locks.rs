//! On a cluster node: advisory locks that hold across nodes.
//!
//! Each node's kernel would keep POSIX record locks and `flock` locks to
//! itself, so a lock taken on one node would not exclude a process on
//! another. A cluster node's mount takes them over instead (the kernel
//! sends them when the mount asks for `FUSE_POSIX_LOCKS` and
//! `FUSE_FLOCK_LOCKS`): each is a replicated Command (`FsOp::Lock`) on
//! tablix-fs's lock table, decided by its place in the log, so every
//! node sees the same holders. A `flock` arrives as a lock of the whole
//! file whose owner is the open file description.
//!
//! * A lock refused while the caller would wait (`F_SETLKW`, `flock`
//!   without `LOCK_NB`) is parked, not held on a mount thread: a thread
//!   of its own tries the parked ones again whenever the node's state
//!   shows no conflict, and answers a caller that got a signal (or died)
//!   EINTR, as the pipe engine does (fuser answers no INTERRUPT).
//! * A lock is given up on the owner's close: a POSIX owner's at every
//!   FLUSH of the file (so files are opened with FLUSH on a cluster
//!   node), a `flock` at the RELEASE of its open file description.
//! * A lock taken drops the kernel's cached pages of its file before it
//!   is answered (on a thread of its own, waited for at most a second),
//!   so that what the previous holder wrote through another node is
//!   read, not a page cached before it.
//! * A node's locks go when it mounts again (its kernel, and its
//!   processes' descriptors, are new) and when it leaves the cluster.
//! * A lock's changes of its file (its process's, or through the open
//!   file it was taken through) are proposed fenced (`FsOp::Fenced`),
//!   and once the node's lease took the lock (`tablix_lost_lock`) they
//!   are refused with EIO until the file is closed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, mpsc};
use std::time::Duration;

use fuser::{INodeNo, Notifier, ReplyEmpty};
use tablix_fs::{Errno, FsOp, Ino, LockKind, read};
use tablix_store::{Stamp, Store};

use crate::errno::{fs_errno, store_errno, to_fuser};

/// How often parked lock requests are looked at when nothing changed.
const RETRY: Duration = Duration::from_millis(20);

/// How long a lock's caller waits for its file's cached pages to go.
const DROP_WAIT: Duration = Duration::from_secs(1);

/// Most (file, process) pairs whose lost lock was logged that are kept
/// to log each once; past it the record starts again.
const TOLD: usize = 4096;

/// One lock request, as the kernel sent it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LockRequest {
    pub(crate) ino: Ino,
    pub(crate) owner: u64,
    pub(crate) pid: u32,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) kind: LockKind,
    /// The handle of the open file it came through (0: none).
    pub(crate) fh: u64,
}

impl LockRequest {
    /// A request as the kernel sends it through open file `fh`, its
    /// `struct flock` type included.
    pub(crate) fn of(
        (ino, fh): (Ino, u64),
        owner: u64,
        pid: u32,
        (start, end): (u64, u64),
        typ: i32,
    ) -> Result<LockRequest, Errno> {
        Ok(LockRequest {
            ino,
            owner,
            pid,
            start,
            end,
            kind: lock_kind(typ)?,
            fh,
        })
    }
}

struct Parked {
    request: LockRequest,
    /// The task that waits (a thread of the lock's process), whose
    /// signals end the wait.
    waiter: u32,
    reply: ReplyEmpty,
}

#[derive(Default)]
struct Waiting {
    parked: Vec<Parked>,
    stopped: bool,
}

/// A file whose cached pages are to be dropped, and who waits for it.
type PageDrop = (Ino, mpsc::SyncSender<()>);

pub(crate) struct Locks {
    node: u64,
    store: Arc<Store>,
    /// The thread that drops a newly locked file's cached pages, once
    /// the file system is mounted.
    dropper: OnceLock<Mutex<mpsc::Sender<PageDrop>>>,
    waiting: Mutex<Waiting>,
    changed: Condvar,
    /// The (file, process) pairs refused for a lost lock, logged once.
    told: Mutex<HashSet<(Ino, u32)>>,
    /// The locks taken through each open file, by its handle, as (file,
    /// owner), until it is released: a change through that open file
    /// is its locks' owners' (a `flock` taken by a helper process, for
    /// its parent to write under).
    through: Mutex<HashMap<u64, HashSet<(Ino, u64)>>>,
}

/// The lock kind of a `struct flock` type.
pub(crate) fn lock_kind(typ: i32) -> Result<LockKind, Errno> {
    match typ {
        libc::F_RDLCK => Ok(LockKind::Read),
        libc::F_WRLCK => Ok(LockKind::Write),
        libc::F_UNLCK => Ok(LockKind::Unlock),
        _ => Err(Errno::EINVAL),
    }
}

impl Locks {
    pub(crate) fn new(node: u64, store: Arc<Store>) -> Arc<Locks> {
        Arc::new(Locks {
            node,
            store,
            dropper: OnceLock::new(),
            waiting: Mutex::new(Waiting::default()),
            changed: Condvar::new(),
            told: Mutex::default(),
            through: Mutex::default(),
        })
    }

    fn waiting(&self) -> MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the thread that drops cached pages through `notifier`. It
    /// is a thread of its own, not the lock's caller's mount thread: the
    /// kernel drops a page only once a read in flight unlocks it, and
    /// that read needs a free mount thread.
    pub(crate) fn start_dropping(&self, notifier: Notifier) -> std::io::Result<()> {
        let (tx, rx) = mpsc::channel::<PageDrop>();
        std::thread::Builder::new()
            .name("tablix-fuse-lock-pages".into())
            .spawn(move || {
                for (ino, done) in rx {
                    if let Err(e) = notifier.inval_inode(INodeNo(ino), 0, 0) {
                        tracing::debug!("dropping the cached pages of locked inode {ino}: {e}");
                    }
                    let _ = done.try_send(());
                }
            })?;
        let _ = self.dropper.set(Mutex::new(tx));
        Ok(())
    }

    /// Drops the kernel's cached pages of `ino` without waiting: for a
    /// caller that may hold some of them locked itself (a write through
    /// the page cache, not answered yet).
    pub(crate) fn drop_pages_later(&self, ino: Ino) {
        let Some(dropper) = self.dropper.get() else {
            return;
        };
        let (done, _) = mpsc::sync_channel(1);
        if let Ok(d) = dropper.lock() {
            let _ = d.send((ino, done));
        }
    }

    /// Drops the kernel's cached pages of `ino`, waiting at most
    /// [`DROP_WAIT`] (past it the mount threads are all busy, and the
    /// pages go a moment later).
    fn drop_pages(&self, ino: Ino) {
        let Some(dropper) = self.dropper.get() else {
            return;
        };
        let (done, dropped) = mpsc::sync_channel(1);
        let sent = dropper
            .lock()
            .map(|d| d.send((ino, done)).is_ok())
            .unwrap_or(false);
        if sent && dropped.recv_timeout(DROP_WAIT).is_err() {
            tracing::debug!("the cached pages of locked inode {ino} are dropped late");
        }
    }

    /// F_GETLK: a lock that would stop `request`, as (start, end, type,
    /// pid; 0 for a holder on another node), or F_UNLCK.
    pub(crate) fn conflicting(&self, request: LockRequest) -> Result<(u64, u64, i32, u32), Errno> {
        if request.kind == LockKind::Unlock {
            return Err(Errno::EINVAL);
        }
        Ok(match self.conflict(request)? {
            Some(held) => (
                held.start,
                held.end,
                if held.write {
                    libc::F_WRLCK
                } else {
                    libc::F_RDLCK
                },
                if held.node == self.node { held.pid } else { 0 },
            ),
            None => (0, 0, libc::F_UNLCK, 0),
        })
    }

    /// Proposes `request`; a lock taken drops the file's cached pages.
    fn take(&self, request: LockRequest) -> Result<(), Errno> {
        let op = FsOp::Lock {
            node: self.node,
            owner: request.owner,
            pid: request.pid,
            ino: request.ino,
            start: request.start,
            end: request.end,
            kind: request.kind,
        };
        self.store
            .apply_fs_now(Stamp::now(), op)
            .map_err(|e| store_errno(&e))??;
        if request.kind != LockKind::Unlock {
            if request.fh != 0
                && let Ok(mut through) = self.through.lock()
            {
                through
                    .entry(request.fh)
                    .or_default()
                    .insert((request.ino, request.owner));
            }
            self.drop_pages(request.ino);
        }
        Ok(())
    }

    /// Open file `fh` was released: the locks taken through it are
    /// their owners' alone.
    pub(crate) fn released(&self, fh: u64) {
        if let Ok(mut through) = self.through.lock() {
            through.remove(&fh);
        }
    }

    /// The owners of locks on `ino` taken through open file `fh`.
    fn owners_through(&self, fh: u64, ino: Ino) -> Vec<u64> {
        self.through
            .lock()
            .ok()
            .and_then(|t| {
                t.get(&fh).map(|set| {
                    set.iter()
                        .filter(|(i, _)| *i == ino)
                        .map(|(_, owner)| *owner)
                        .collect()
                })
            })
            .unwrap_or_default()
    }

    /// F_SETLK, and F_SETLKW (`wait`, by task `waiter`): answered at
    /// once, or parked until the lock is free or the waiter is
    /// interrupted.
    pub(crate) fn set(&self, request: LockRequest, wait: Option<u32>, reply: ReplyEmpty) {
        match (self.take(request), wait) {
            (Ok(()), _) => reply.ok(),
            (Err(Errno::EAGAIN), Some(waiter)) => {
                let mut w = self.waiting();
                if w.stopped {
                    drop(w);
                    reply.error(to_fuser(Errno::EINTR));
                    return;
                }
                w.parked.push(Parked {
                    request,
                    waiter,
                    reply,
                });
                drop(w);
                self.changed.notify_all();
            }
            (Err(e), _) => reply.error(to_fuser(e)),
        }
    }

    /// EIO while process `pid` (a thread's id, as FUSE gives it), or
    /// open file `fh`, held a lock on `ino` that this node's lease took
    /// and has not closed the file since: another node's process may
    /// have taken the lock and changed the file meanwhile, and what this
    /// one writes now could undo that (an NFS client whose lease ran out
    /// does the same).
    pub(crate) fn not_lost(&self, ino: Ino, pid: u32, fh: u64) -> Result<(), Errno> {
        self.holder(ino, pid, fh).map(|_| ())
    }

    /// `op`, a change of `ino` by process `pid` through open file `fh`,
    /// as it is to be proposed: refused as [`Locks::not_lost`] says, and
    /// fenced (`FsOp::Fenced`) while the process, or a lock taken
    /// through `fh`, holds a lock on `ino`, so that it is refused where
    /// it lands in the log if the lease took that lock before it (this
    /// node may learn of it only after sending the change).
    pub(crate) fn fence(&self, ino: Ino, pid: u32, fh: u64, op: FsOp) -> Result<FsOp, Errno> {
        Ok(match self.holder(ino, pid, fh)? {
            Some(pid) => FsOp::Fenced {
                node: self.node,
                pid,
                ino,
                op: Box::new(op),
            },
            None => op,
        })
    }

    /// The process id of the lock on `ino` that a change by `pid`
    /// through `fh` is made under, if any: the process's own, or one
    /// taken through `fh`. EIO if the lease took such a lock.
    fn holder(&self, ino: Ino, pid: u32, fh: u64) -> Result<Option<u32>, Errno> {
        let (held, lost) = self
            .store
            .read_latest(|c| {
                Ok((
                    read::file_locks(c, ino, self.node)?,
                    read::file_lost_locks(c, ino, self.node)?,
                ))
            })
            .map_err(|e| store_errno(&e))?
            .map_err(|e: tablix_fs::FsError| fs_errno(&e))?;
        if held.is_empty() && lost.is_empty() {
            return Ok(None);
        }
        let owners = self.owners_through(fh, ino);
        // A lock of `p` or one taken through `fh`, as its process's id.
        let of = |rows: &[(u64, u32)], p: u32| {
            rows.iter()
                .find(|(owner, q)| *q == p || owners.contains(owner))
                .map(|(_, q)| *q)
        };
        let standing = |p: u32| match of(&lost, p) {
            Some(_) => {
                self.lost(ino, p);
                Err(Errno::EIO)
            }
            None => Ok(of(&held, p)),
        };
        match standing(pid)? {
            Some(p) => Ok(Some(p)),
            // Not the id a lock records (a process's) but a thread's,
            // whose process is looked up only now that it may matter.
            None => match thread_group(pid) {
                Some(process) if process != pid => standing(process),
                _ => Ok(None),
            },
        }
    }

    /// Says (once per file and process) why process `pid`'s change of
    /// `ino` was refused: its lock was lost.
    pub(crate) fn lost(&self, ino: Ino, pid: u32) {
        let Ok(mut told) = self.told.lock() else {
            return;
        };
        if told.len() >= TOLD {
            told.clear();
        }
        if told.insert((ino, pid)) {
            tracing::warn!(
                "process {pid} held a lock on inode {ino} that the cluster's lock lease took while this node was out of reach: its changes to the file fail with EIO until it closes it"
            );
        }
    }

    /// The owner closed the file: every lock it holds on it goes, and
    /// so does the record of one its node's lease took.
    pub(crate) fn closed(&self, ino: Ino, owner: u64) -> Result<(), Errno> {
        let holds = self
            .store
            .read(|c| read::holds_or_lost_lock(c, ino, (self.node, owner)))
            .map_err(|e| store_errno(&e))?
            .map_err(|e| fs_errno(&e))?;
        if !holds {
            return Ok(());
        }
        self.take(LockRequest {
            ino,
            owner,
            pid: 0,
            start: 0,
            end: u64::MAX,
            kind: LockKind::Unlock,
            fh: 0,
        })
    }

    pub(crate) fn stop(&self) {
        let parked = {
            let mut w = self.waiting();
            w.stopped = true;
            std::mem::take(&mut w.parked)
        };
        for p in parked {
            p.reply.error(to_fuser(Errno::EINTR));
        }
        self.changed.notify_all();
    }

    /// What in the node's state stands in `request`'s way.
    fn conflict(&self, request: LockRequest) -> Result<Option<read::HeldLock>, Errno> {
        self.store
            .read(|c| {
                read::lock_conflict(
                    c,
                    request.ino,
                    (self.node, request.owner),
                    (request.start, request.end),
                    request.kind == LockKind::Write,
                )
            })
            .map_err(|e| store_errno(&e))?
            .map_err(|e| fs_errno(&e))
    }
}

/// The process (thread group) thread `tid` belongs to: a lock records
/// its process's id, a request the id of the thread that sent it.
fn thread_group(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The thread serving parked lock requests until the mount stops.
pub(crate) fn run(locks: Arc<Locks>) {
    loop {
        let parked = {
            let mut w = locks.waiting();
            if w.stopped {
                return;
            }
            if w.parked.is_empty() {
                w = locks.changed.wait(w).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            w = locks
                .changed
                .wait_timeout(w, RETRY)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
            if w.stopped {
                return;
            }
            std::mem::take(&mut w.parked)
        };
        let mut still = Vec::new();
        for p in parked {
            if crate::pipes::interrupted(p.waiter) {
                p.reply.error(to_fuser(Errno::EINTR));
            } else if !matches!(locks.conflict(p.request), Ok(None)) {
                still.push(p);
            } else {
                match locks.take(p.request) {
                    Ok(()) => p.reply.ok(),
                    Err(Errno::EAGAIN) => still.push(p),
                    Err(e) => p.reply.error(to_fuser(e)),
                }
            }
        }
        let mut w = locks.waiting();
        if w.stopped {
            drop(w);
            for p in still {
                p.reply.error(to_fuser(Errno::EINTR));
            }
            return;
        }
        w.parked.extend(still);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_belongs_to_its_process() {
        let me = std::process::id();
        assert_eq!(thread_group(me), Some(me));
        let (tx, rx) = mpsc::channel();
        let (done, wait) = mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let _ = tx.send(nix::unistd::gettid().as_raw() as u32);
            let _ = wait.recv();
        });
        let tid = rx.recv().expect("the thread's id");
        assert_ne!(tid, me);
        assert_eq!(thread_group(tid), Some(me));
        drop(done);
        t.join().expect("the thread");
    }

    #[test]
    fn lock_types_map_to_kinds_and_others_are_refused() {
        assert_eq!(lock_kind(libc::F_RDLCK), Ok(LockKind::Read));
        assert_eq!(lock_kind(libc::F_WRLCK), Ok(LockKind::Write));
        assert_eq!(lock_kind(libc::F_UNLCK), Ok(LockKind::Unlock));
        assert_eq!(lock_kind(99), Err(Errno::EINVAL));
    }
}
