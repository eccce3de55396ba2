//! A model of the machine losing power, for crash tests: every write to a
//! segment since its last fdatasync is recorded with the bytes it
//! replaced, so that [`PowerModel::lose_unsynced`] puts each file back as
//! the disk held it at its last sync. Without a model (in production)
//! nothing is recorded.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// One write not yet synced: what the file held in its place.
struct Undo {
    path: PathBuf,
    at: u64,
    /// The bytes the write replaced, up to the file's old end.
    old: Vec<u8>,
    /// The file's length before the write.
    old_len: u64,
}

#[derive(Default)]
pub struct PowerModel {
    halted: AtomicBool,
    unsynced: Mutex<Vec<Undo>>,
}

impl PowerModel {
    pub fn new() -> PowerModel {
        PowerModel::default()
    }

    /// From now on nothing more reaches the log's files: every write and
    /// sync fails, as if the machine had stopped.
    pub fn halt(&self) {
        self.halted.store(true, Ordering::Release);
    }

    pub fn is_halted(&self) -> bool {
        self.halted.load(Ordering::Acquire)
    }

    /// Puts every segment back as its last fdatasync left it: the writes
    /// since are undone, newest first. Call it after [`PowerModel::halt`],
    /// with the log closed.
    pub fn lose_unsynced(&self) -> std::io::Result<()> {
        let undo = std::mem::take(&mut *self.lock());
        for u in undo.iter().rev() {
            let f = match OpenOptions::new().write(true).open(&u.path) {
                Ok(f) => f,
                // A file deleted since: its removal is what was lost, and
                // the log does not need it back (only free segments are
                // deleted).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            f.write_all_at(&u.old, u.at)?;
            f.set_len(u.old_len)?;
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Undo>> {
        self.unsynced.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records what a write of `len` bytes at `at` (or a change of the
    /// length to `at`, with `len` 0) replaces.
    pub(crate) fn before_write(
        &self,
        file: &File,
        path: &Path,
        at: u64,
        len: u64,
    ) -> std::io::Result<()> {
        let old_len = file.metadata()?.len();
        let end = if len == 0 { old_len } else { at + len }.min(old_len);
        let mut old = vec![0u8; end.saturating_sub(at) as usize];
        file.read_exact_at(&mut old, at)?;
        self.lock().push(Undo {
            path: path.to_path_buf(),
            at,
            old,
            old_len,
        });
        Ok(())
    }

    /// Everything written to `path` is durable now.
    pub(crate) fn synced(&self, path: &Path) {
        self.lock().retain(|u| u.path != path);
    }
}

impl std::fmt::Debug for PowerModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PowerModel")
            .field("halted", &self.is_halted())
            .field("unsynced_writes", &self.lock().len())
            .finish()
    }
}
