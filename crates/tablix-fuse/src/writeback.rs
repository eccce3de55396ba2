//! Async mode's bound on what the kernel holds. With the writeback cache a
//! `write(2)` ends in the kernel's page cache, and the kernel sends it to
//! the daemon only when its own writeback runs: 30 s after the page was
//! dirtied (`vm.dirty_expire_centisecs`), on fsync, or when the file is
//! closed for the last time. A program that keeps a file open would have
//! its acknowledged writes outside the store for that long, and lose them
//! with the daemon or the machine, far past the flush interval async mode
//! promises. So while some file of the mount is open for writing, a thread
//! asks the kernel every half interval to write the mount's dirty pages
//! back (`syncfs(2)` on the mount's root) and then has the store commit
//! what came: a write is in the store within half the interval and durable
//! soon after, within the interval as long as that push and commit take
//! less than its other half.
//!
//! `syncfs` on a FUSE mount sends no request of its own (the kernel sends
//! FUSE_SYNCFS only to virtiofs): it writes back dirty pages as WRITE
//! requests, which this mount's threads answer, and waits for them,
//! uninterruptibly. A thread of the daemon must never wait so on its own
//! mount: killed then, the daemon cannot finish dying (that thread waits
//! for WRITEs its dead threads will never answer, and the mount's device
//! stays open, so the kernel never ends them), and every program using
//! the mount hangs with it. So the call runs in a child process, `sync
//! --file-system`, which holds no descriptor of the device (the daemon
//! opens every descriptor close-on-exec); the daemon's thread waits for
//! the child, which a kill ends. A dying daemon closes the device, the
//! kernel fails the WRITEs, and the child ends too. For the same reason
//! the daemon's thread makes no request of the mount itself: a request
//! its threads read and did not answer before they were killed is waited
//! for uninterruptibly too. It finds the mount in /proc/self/mountinfo,
//! by the id it had when mounted, and runs no child once the mount left
//! the path (the mount point is then another file system's directory).
//! The child holds the root open only for that call, so that an `umount`
//! meets no descriptor.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tablix_store::Store;

/// What the mount's handlers tell the writeback thread.
#[derive(Debug, Default)]
pub(crate) struct Writeback {
    /// Files open for writing (opened, not yet released): only they can
    /// have pages dirtied in the kernel.
    writers: AtomicU64,
    /// WRITE requests received (each is applied and awaits the store's
    /// commit).
    writes: AtomicU64,
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Writeback {
    pub(crate) fn new() -> Arc<Writeback> {
        Arc::new(Writeback::default())
    }

    /// A file opened (or created) with `flags`.
    pub(crate) fn opened(&self, flags: i32) {
        if writable(flags) {
            self.writers.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A file opened with `flags` released: the kernel wrote its dirty
    /// pages back before releasing it.
    pub(crate) fn released(&self, flags: i32) {
        if writable(flags) {
            // Never below zero, whatever the kernel sends: a release
            // this count missed the open of must not wrap it.
            let _ = self
                .writers
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    pub(crate) fn wrote(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stop(&self) {
        if let Ok(mut s) = self.stopped.lock() {
            *s = true;
        }
        self.wake.notify_all();
    }

    /// Waits `period`; false once stopped.
    fn tick(&self, period: Duration) -> bool {
        let Ok(s) = self.stopped.lock() else {
            return false;
        };
        match self.wake.wait_timeout_while(s, period, |s| !*s) {
            Ok((s, _)) => !*s,
            Err(_) => false,
        }
    }
}

fn writable(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY
}

/// Pushes the kernel's dirty pages of the mount at `root` to the store
/// every half `interval` while files are open for writing, until stopped
/// or the session `ended`.
pub(crate) fn run(
    wb: Arc<Writeback>,
    (root, mount_id): (PathBuf, u64),
    interval: Duration,
    store: Arc<Store>,
    ended: Arc<AtomicBool>,
) {
    let period = (interval / 2).max(Duration::from_millis(1));
    let mut failure_logged = false;
    while wb.tick(period) && !ended.load(Ordering::Acquire) {
        if wb.writers.load(Ordering::Relaxed) == 0 {
            continue;
        }
        let before = wb.writes.load(Ordering::Relaxed);
        match push(&root, mount_id) {
            Ok(()) => failure_logged = false,
            Err(e) if !failure_logged => {
                failure_logged = true;
                tracing::warn!(
                    "asking the kernel to write {}'s cached pages back: {e}; they reach the store when it writes them back on its own",
                    root.display()
                );
            }
            Err(_) => {}
        }
        // Writes that came while the kernel wrote back are committed now,
        // not within the store's own interval; writes that came between
        // pushes (a program's fsync, a close) have it already counting,
        // and a commit for each tick would only add syncs.
        if wb.writes.load(Ordering::Relaxed) != before {
            // A failed flush is the store's to report (it marks what was
            // lost and refuses later changes).
            let _ = store.flush().wait();
        }
    }
}

/// Has the kernel write back the dirty pages of the mount at `root`
/// (mount id `mount_id`), from a child process (see the module's comment).
fn push(root: &Path, mount_id: u64) -> Result<(), String> {
    // Read from /proc, not asked of the mount.
    if crate::mount::mounted_at(root).is_none_or(|m| m.id != mount_id) {
        return Ok(());
    }
    let status = Command::new("sync")
        .arg("--file-system")
        .arg(root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("running sync --file-system: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("sync --file-system: {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_open_for_writing_count_and_never_below_zero() {
        let wb = Writeback::new();
        wb.opened(libc::O_RDONLY);
        assert_eq!(wb.writers.load(Ordering::Relaxed), 0);
        wb.opened(libc::O_WRONLY | libc::O_CREAT);
        wb.opened(libc::O_RDWR);
        assert_eq!(wb.writers.load(Ordering::Relaxed), 2);
        wb.released(libc::O_RDONLY);
        assert_eq!(wb.writers.load(Ordering::Relaxed), 2);
        wb.released(libc::O_RDWR);
        wb.released(libc::O_WRONLY);
        wb.released(libc::O_WRONLY);
        assert_eq!(wb.writers.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_stopped_writeback_wakes_at_once() {
        let wb = Writeback::new();
        let w = Arc::clone(&wb);
        let t = std::thread::spawn(move || w.tick(Duration::from_secs(60)));
        std::thread::sleep(Duration::from_millis(20));
        wb.stop();
        assert!(!t.join().unwrap());
    }
}
