//! On a cluster node: which stored inodes this node's kernel holds, and
//! the releasing of unlinked ones it does not.
//!
//! An unlinked file stays readable while it is open, and on a cluster it
//! may be open on any node. So an unlinked inode is freed only once every
//! mounted node has released it (`FsOp::Release`, tablix-fs's
//! `tablix_release`), and a node releases an inode only when its kernel
//! cannot reach it: the kernel holds an inode from each reply that hands
//! it over (an entry: LOOKUP, CREATE, MKNOD, MKDIR, SYMLINK, LINK, each
//! READDIRPLUS entry) until it FORGETs as many lookups, and an open file
//! keeps it held. The counts here follow that.
//!
//! The releaser finds the unlinked inodes its node has not released in
//! the node's state, then waits for every handing operation begun before
//! it looked to end, and releases those whose count is 0. An operation
//! begun later read a state in which they were already unlinked, so it
//! cannot hand one over: no name leads to them. One begun earlier may have
//! read an older state, and its count is in before the releaser decides.
//!
//! Invariant: an inode is released by this node only when no operation
//! that could still hand it to the kernel is running and the kernel holds
//! no lookup of it.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use tablix_fs::{FsOp, Ino};
use tablix_store::{Stamp, Stamped, Store};

/// How often the releaser looks even when nothing nudged it: an inode
/// unlinked through another node becomes this node's to release when its
/// unlinking is applied here, which nothing on this node announces.
const SWEEP: Duration = Duration::from_millis(500);

/// Most inodes one `Release` Command carries.
const RELEASE_BATCH: usize = 4096;

pub(crate) struct KernelRefs {
    node: u64,
    next_op: AtomicU64,
    inner: Mutex<Inner>,
    /// Signalled when an operation ends, and when the releaser is nudged
    /// or stopped.
    changed: Condvar,
}

#[derive(Default)]
struct Inner {
    /// Lookups the kernel holds, per inode (absent: none).
    lookups: HashMap<Ino, u64>,
    /// Handing operations still running, by the number each began with.
    running: BTreeSet<u64>,
    nudged: bool,
    stopped: bool,
}

/// An operation that may hand the kernel inodes; what it hands over is
/// counted when it ends.
pub(crate) struct Handing<'a> {
    refs: &'a KernelRefs,
    number: u64,
    handed: Vec<Ino>,
}

impl Handing<'_> {
    /// The reply carries an entry for `ino`.
    pub(crate) fn hand(&mut self, ino: Ino) {
        self.handed.push(ino);
    }
}

impl Drop for Handing<'_> {
    fn drop(&mut self) {
        let mut inner = self.refs.lock();
        for &ino in &self.handed {
            *inner.lookups.entry(ino).or_default() += 1;
        }
        inner.running.remove(&self.number);
        drop(inner);
        self.refs.changed.notify_all();
    }
}

impl KernelRefs {
    pub(crate) fn new(node: u64) -> Arc<KernelRefs> {
        Arc::new(KernelRefs {
            node,
            next_op: AtomicU64::new(0),
            inner: Mutex::new(Inner::default()),
            changed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The counts stay consistent under a panic elsewhere: every update
        // is a single step.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Begins an operation that may hand inodes over, before it reads the
    /// state or proposes anything.
    pub(crate) fn begin(&self) -> Handing<'_> {
        let mut inner = self.lock();
        let number = self.next_op.fetch_add(1, Ordering::SeqCst);
        inner.running.insert(number);
        Handing {
            refs: self,
            number,
            handed: Vec::new(),
        }
    }

    /// The kernel forgot `nlookup` lookups of `ino`; true when it holds
    /// none any more.
    pub(crate) fn forget(&self, ino: Ino, nlookup: u64) -> bool {
        let mut inner = self.lock();
        match inner.lookups.get_mut(&ino) {
            Some(n) if *n > nlookup => {
                *n -= nlookup;
                false
            }
            _ => {
                inner.lookups.remove(&ino);
                true
            }
        }
    }

    /// Asks the releaser to look now.
    pub(crate) fn nudge(&self) {
        self.lock().nudged = true;
        self.changed.notify_all();
    }

    pub(crate) fn stop(&self) {
        self.lock().stopped = true;
        self.changed.notify_all();
    }

    /// Waits until nudged, stopped or a sweep's time passed; false once
    /// stopped.
    fn wait_for_turn(&self) -> bool {
        let mut inner = self.lock();
        if !inner.nudged && !inner.stopped {
            inner = self
                .changed
                .wait_timeout(inner, SWEEP)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        inner.nudged = false;
        !inner.stopped
    }

    /// Of `unlinked`, those the kernel cannot reach: waits for every
    /// handing operation begun before this call to end first. None once
    /// stopped.
    fn unreachable(&self, unlinked: Vec<Ino>) -> Option<Vec<Ino>> {
        let horizon = self.next_op.load(Ordering::SeqCst);
        let mut inner = self.lock();
        while inner.running.first().is_some_and(|&n| n < horizon) {
            if inner.stopped {
                return None;
            }
            inner = self.changed.wait(inner).unwrap_or_else(|p| p.into_inner());
        }
        Some(
            unlinked
                .into_iter()
                .filter(|ino| !inner.lookups.contains_key(ino))
                .collect(),
        )
    }

    #[cfg(test)]
    fn lookups(&self, ino: Ino) -> u64 {
        self.lock().lookups.get(&ino).copied().unwrap_or(0)
    }
}

/// The releaser: until stopped, releases for this node the unlinked
/// inodes its kernel does not hold. A release that fails (no leader) is
/// tried again at the next turn; nothing is lost meanwhile, the inodes
/// only wait.
pub(crate) fn run(refs: Arc<KernelRefs>, store: Arc<Store>) {
    while refs.wait_for_turn() {
        let found = store
            .read_latest(|c| unreleased(c, refs.node).map_err(|e| e.to_string()))
            .map_err(|e| e.to_string())
            .and_then(|r| r);
        let unlinked = match found {
            Ok(inodes) => inodes,
            Err(e) => {
                tracing::warn!("finding unlinked inodes to release: {e}");
                continue;
            }
        };
        if unlinked.is_empty() {
            continue;
        }
        let Some(free) = refs.unreachable(unlinked) else {
            return;
        };
        for inodes in free.chunks(RELEASE_BATCH) {
            let op = FsOp::Release {
                node: refs.node,
                inodes: inodes.to_vec(),
            };
            match store.submit_fs(Stamped::new(Stamp::now(), op)).wait() {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!("releasing unlinked inodes: {e}"),
                Err(e) => {
                    tracing::debug!("releasing unlinked inodes, to be tried again: {e}");
                    break;
                }
            }
        }
    }
}

/// The unlinked inodes `node` has not released, in this node's state.
fn unreleased(c: &rusqlite::Connection, node: u64) -> rusqlite::Result<Vec<Ino>> {
    let mut st = c.prepare_cached(
        "SELECT i.ino FROM tablix_inode i WHERE i.nlink = 0 AND NOT EXISTS
             (SELECT 1 FROM tablix_release r WHERE r.ino = i.ino AND r.node = ?1)",
    )?;
    let rows = st.query_map([node as i64], |r| r.get::<_, i64>(0))?;
    rows.map(|r| r.map(|i| i as Ino)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_count_until_forgotten_and_only_ended_operations_count() {
        let refs = KernelRefs::new(1);
        let mut op = refs.begin();
        op.hand(7);
        op.hand(7);
        assert_eq!(refs.lookups(7), 0, "counted when the operation ends");
        drop(op);
        assert_eq!(refs.lookups(7), 2);
        assert!(!refs.forget(7, 1));
        assert!(refs.forget(7, 1));
        assert_eq!(refs.lookups(7), 0);
        // A forget of more than was counted leaves nothing, not a debt.
        assert!(refs.forget(8, 3));
        assert_eq!(refs.lookups(8), 0);
    }

    #[test]
    fn the_releaser_waits_for_operations_begun_before_it_looked() {
        let refs = KernelRefs::new(1);
        let mut earlier = refs.begin();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| tx.send(refs.unreachable(vec![5, 6])).unwrap());
            // The releaser is blocked by the operation begun before it.
            assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
            // One begun after it does not hold it up.
            let later = refs.begin();
            earlier.hand(5);
            drop(earlier);
            let free = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(free, Some(vec![6]), "inode 5 was handed over");
            drop(later);
        });
    }

    #[test]
    fn a_stopped_releaser_stops_waiting() {
        let refs = KernelRefs::new(1);
        let _running = refs.begin();
        std::thread::scope(|s| {
            let waiting = s.spawn(|| refs.unreachable(vec![5]));
            std::thread::sleep(Duration::from_millis(50));
            refs.stop();
            assert_eq!(waiting.join().unwrap(), None);
        });
        assert!(!refs.wait_for_turn());
    }
}
