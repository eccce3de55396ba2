//! Keeping this kernel's caches of the mount true when replication
//! applies file-system changes it did not see: those made through another
//! node's mount, or through SQL. The store tells every file-system Command
//! replication applies (`Store::watch_fs`) but those this mount has in
//! flight (the kernel saw those; the store asks before it answers them);
//! a thread of its own turns what each may have made stale into FUSE
//! invalidation notices.
//!
//! The notices go out from that thread, never from the writer's: the
//! kernel may wait on a page that a write in flight holds, and that write
//! waits on the writer.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Mutex;
use std::sync::mpsc::Receiver;

use fuser::{INodeNo, Notifier};
use tablix_fs::Touched;
use tablix_store::FsApplied;

/// The stamps' seeds of the changes this mount has in flight, kept only
/// on a cluster node (elsewhere no notice is ever sent, and a write's path
/// pays nothing for it).
pub(crate) struct InFlight {
    kept: bool,
    seeds: Mutex<HashSet<u64>>,
}

impl InFlight {
    pub(crate) fn new(kept: bool) -> InFlight {
        InFlight {
            kept,
            seeds: Mutex::default(),
        }
    }

    /// Runs `f` with `seed` marked as this mount's while it runs.
    pub(crate) fn during<R>(&self, seed: u64, f: impl FnOnce() -> R) -> R {
        if !self.kept {
            return f();
        }
        if let Ok(mut s) = self.seeds.lock() {
            s.insert(seed);
        }
        let r = f();
        if let Ok(mut s) = self.seeds.lock() {
            s.remove(&seed);
        }
        r
    }

    /// Whether the Command of this stamp's seed is this mount's, in
    /// flight.
    pub(crate) fn contains(&self, seed: u64) -> bool {
        self.seeds
            .lock()
            .map(|s| s.contains(&seed))
            .unwrap_or(false)
    }
}

/// Serves the notices until the store lets go of the channel (which
/// leaves out this mount's own Commands: `InFlight::contains`).
pub(crate) fn run(notes: Receiver<FsApplied>, notifier: Notifier) {
    for note in notes {
        for touched in note.touched {
            let sent = match &touched {
                Touched::Entry { parent, name } => {
                    notifier.inval_entry(INodeNo(*parent), OsStr::from_bytes(name))
                }
                // A negative offset: the attributes only.
                Touched::Attr(ino) => notifier.inval_inode(INodeNo(*ino), -1, 0),
                Touched::Data { ino, offset, len } => notifier.inval_inode(
                    INodeNo(*ino),
                    i64::try_from(*offset).unwrap_or(i64::MAX),
                    i64::try_from(*len).unwrap_or(0),
                ),
            };
            match sent {
                Ok(()) => {}
                // The kernel holds nothing of it: nothing to invalidate.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => tracing::debug!("invalidating {touched:?}: {e}"),
            }
        }
    }
}
