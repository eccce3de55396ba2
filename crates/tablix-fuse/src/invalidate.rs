//! Keeping this kernel's caches of the mount true when replication
//! applies file-system changes it did not see: those made through another
//! node's mount, or through SQL. The store tells every file-system Command
//! replication applies (`Store::watch_fs`); a thread of its own turns what
//! each may have made stale into FUSE invalidation notices, skipping the
//! Commands this mount made (the kernel saw those).
//!
//! The notices go out from that thread, never from the writer's: the
//! kernel may wait on a page that a write in flight holds, and that write
//! waits on the writer.

use std::collections::{HashSet, VecDeque};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Mutex;
use std::sync::mpsc::Receiver;

use fuser::{INodeNo, Notifier};
use tablix_fs::Touched;
use tablix_store::FsApplied;

/// The most changes of this mount remembered once answered: the store
/// tells a change after answering it, so its note may come after the
/// change left `in_flight`; a note comes within a few changes of its own.
const RECENT: usize = 1024;

/// The stamps' seeds of the changes this mount has in flight or answered
/// lately, kept only on a cluster node (elsewhere no notice is ever sent,
/// and a write's path pays nothing for it).
pub(crate) struct InFlight {
    kept: bool,
    seeds: Mutex<Seeds>,
}

#[derive(Default)]
struct Seeds {
    in_flight: HashSet<u64>,
    /// Answered lately, oldest first, with the same seeds as a set.
    recent: VecDeque<u64>,
    recent_set: HashSet<u64>,
}

impl InFlight {
    pub(crate) fn new(kept: bool) -> InFlight {
        InFlight {
            kept,
            seeds: Mutex::default(),
        }
    }

    /// Runs `f` with `seed` marked as this mount's while it runs, and for
    /// the next [`RECENT`] changes after.
    pub(crate) fn during<R>(&self, seed: u64, f: impl FnOnce() -> R) -> R {
        if !self.kept {
            return f();
        }
        if let Ok(mut s) = self.seeds.lock() {
            s.in_flight.insert(seed);
        }
        let r = f();
        if let Ok(mut s) = self.seeds.lock() {
            s.in_flight.remove(&seed);
            if s.recent_set.insert(seed) {
                s.recent.push_back(seed);
            }
            while s.recent.len() > RECENT {
                if let Some(old) = s.recent.pop_front() {
                    s.recent_set.remove(&old);
                }
            }
        }
        r
    }

    fn contains(&self, seed: u64) -> bool {
        self.seeds
            .lock()
            .map(|s| s.in_flight.contains(&seed) || s.recent_set.contains(&seed))
            .unwrap_or(false)
    }
}

/// Serves the notices until the store lets go of the channel.
pub(crate) fn run(notes: Receiver<FsApplied>, notifier: Notifier, own: std::sync::Arc<InFlight>) {
    for note in notes {
        if own.contains(note.seed) {
            continue;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_stays_this_mounts_while_it_runs_and_for_the_next_ones_after() {
        let own = InFlight::new(true);
        own.during(7, || assert!(own.contains(7), "in flight"));
        assert!(
            own.contains(7),
            "answered a moment ago: its note may follow"
        );
        assert!(!own.contains(8));
        for seed in 100..100 + RECENT as u64 {
            own.during(seed, || ());
        }
        assert!(!own.contains(7), "forgotten after {RECENT} more");
        assert!(own.contains(100) && own.contains(99 + RECENT as u64));
        let elsewhere = InFlight::new(false);
        elsewhere.during(1, || assert!(!elsewhere.contains(1)));
    }
}
