//! Mounting and unmounting, including a stale mount a crashed run left.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use fuser::{BackgroundSession, Config, MountOption, SessionACL};
use tablix_fs::FsOp;
use tablix_store::{LogKeeper, Stamp, Store};

use crate::fs::{FsConfig, TablixFs};
use crate::holders::PipeHolders;
use crate::invalidate::InFlight;
use crate::kernel_refs::KernelRefs;
use crate::locks::Locks;
use crate::writeback::Writeback;

/// Invalidation notices waiting for the kernel, at most.
const INVALIDATIONS_QUEUED: usize = 8192;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("mount point {0} does not exist")]
    Missing(PathBuf),
    #[error("mount point {0} is not a directory")]
    NotDirectory(PathBuf),
    #[error(
        "mount point {path} is busy: {fstype} from {source_name} is already mounted there; unmount it first (umount {path})"
    )]
    Busy {
        path: PathBuf,
        fstype: String,
        source_name: String,
    },
    #[error("mount point {path}: {cause}")]
    Access {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("clearing the stale mount at {path} failed: {reason}")]
    Stale { path: PathBuf, reason: String },
    #[error("preparing the file system failed: {0}")]
    Store(String),
    #[error("mounting at {path} failed: {cause}")]
    Fuse {
        path: PathBuf,
        cause: std::io::Error,
    },
}

/// How to mount.
#[derive(Clone, Debug)]
pub struct MountOptions {
    pub mountpoint: PathBuf,
    pub fs: FsConfig,
    /// Threads serving kernel requests.
    pub threads: usize,
    /// Let every user use the mount (permissions are still enforced by the
    /// kernel from the mode bits: `default_permissions`).
    pub allow_other: bool,
}

/// A live mount; unmounted when dropped.
pub struct Mounted {
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
    ended: Arc<AtomicBool>,
    holders: Arc<PipeHolders>,
    /// A cluster node's: stopped with the mount.
    refs: Option<Arc<KernelRefs>>,
    locks: Option<Arc<Locks>>,
    /// Async mode's: stopped (and joined) before unmounting, so that it
    /// holds no descriptor of the mount then.
    writeback: Option<(Arc<Writeback>, std::thread::JoinHandle<()>)>,
}

impl std::fmt::Debug for Mounted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mounted")
            .field("mountpoint", &self.mountpoint)
            .finish()
    }
}

/// One line of /proc/self/mountinfo: where, what type, from what.
pub(crate) struct MountEntry {
    pub(crate) id: u64,
    point: PathBuf,
    fstype: String,
    source: String,
}

/// Undoes the octal escapes mountinfo uses for space, tab, newline and `\`.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let dash = fields.iter().position(|f| *f == "-")?;
            Some(MountEntry {
                id: fields.first()?.parse().ok()?,
                point: PathBuf::from(unescape(fields.get(4)?)),
                fstype: fields.get(dash + 1)?.to_string(),
                source: unescape(fields.get(dash + 2)?),
            })
        })
        .collect()
}

pub(crate) fn mounted_at(path: &Path) -> Option<MountEntry> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    parse_mountinfo(&text)
        .into_iter()
        .rev()
        .find(|m| m.point == path)
}

/// Detaches whatever is mounted at `path`: directly as root, through
/// fusermount otherwise.
fn detach(path: &Path) -> Result<(), String> {
    match nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EPERM) => {
            for tool in ["fusermount3", "fusermount"] {
                if let Ok(s) = std::process::Command::new(tool)
                    .arg("-u")
                    .arg("-z")
                    .arg(path)
                    .status()
                    && s.success()
                {
                    return Ok(());
                }
            }
            Err("not permitted, and fusermount3 -u -z failed or is not installed".into())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Most stale mounts stacked on one mount point that are cleared.
const MAX_STALE: usize = 8;

/// Checks the mount point, clearing a stale FUSE mount (ENOTCONN: its
/// daemon died without unmounting). Returns the absolute path.
fn prepare(path: &Path) -> Result<PathBuf, MountError> {
    prepare_clearing(path, MAX_STALE)
}

fn prepare_clearing(path: &Path, attempts: usize) -> Result<PathBuf, MountError> {
    let abs = std::path::absolute(path).map_err(|cause| MountError::Access {
        path: path.to_path_buf(),
        cause,
    })?;
    // statfs always reaches a FUSE daemon; stat of the root may be
    // answered from the kernel's cached attributes even when the daemon
    // is gone (a node restarted at once after SIGKILL).
    let probe = nix::sys::statfs::statfs(&abs)
        .map_err(std::io::Error::from)
        .and_then(|_| std::fs::metadata(&abs));
    match probe {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            if attempts == 0 {
                return Err(MountError::Stale {
                    path: abs,
                    reason: format!("still not connected after clearing {MAX_STALE} mounts"),
                });
            }
            detach(&abs).map_err(|reason| MountError::Stale {
                path: abs.clone(),
                reason,
            })?;
            tracing::warn!(
                "cleared a stale mount at {} (its daemon exited without unmounting)",
                abs.display()
            );
            return prepare_clearing(path, attempts - 1);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(MountError::Missing(abs));
        }
        Err(cause) => return Err(MountError::Access { path: abs, cause }),
        Ok(m) if !m.is_dir() => return Err(MountError::NotDirectory(abs)),
        Ok(_) => {}
    }
    let canonical = abs.canonicalize().map_err(|cause| MountError::Access {
        path: abs.clone(),
        cause,
    })?;
    if let Some(m) = mounted_at(&canonical)
        && m.fstype.starts_with("fuse")
    {
        return Err(MountError::Busy {
            path: canonical,
            fstype: m.fstype,
            source_name: m.source,
        });
    }
    Ok(canonical)
}

/// Mounts the store's file system at `options.mountpoint`.
pub fn mount(store: Arc<Store>, options: MountOptions) -> Result<Mounted, MountError> {
    let mountpoint = prepare(&options.mountpoint)?;
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    // A cluster node's kernel is one of several that may hold unlinked
    // files open: they are released node by node (`kernel_refs`).
    let refs = options.fs.node.map(KernelRefs::new);
    let locks = options.fs.node.map(|n| Locks::new(n, Arc::clone(&store)));
    let mounting = match options.fs.node {
        Some(node) => FsOp::MountNode { uid, gid, node },
        None => FsOp::Mount { uid, gid },
    };
    store
        .apply_fs(Stamp::now(), mounting)
        .map_err(|e| MountError::Store(e.to_string()))?
        .map_err(|e| MountError::Store(e.to_string()))?;
    let mut mount_options = vec![
        MountOption::FSName(options.fs.data_dir.display().to_string()),
        MountOption::Subtype("tablix".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
    ];
    if uid == 0 {
        // Device nodes and set-user-ID programs work as on a disk file
        // system; an unprivileged mount cannot have them.
        mount_options.push(MountOption::Dev);
        mount_options.push(MountOption::Suid);
    }
    let mut config = Config::default();
    config.mount_options = mount_options;
    config.acl = if options.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(options.threads.max(1));
    config.clone_fd = true;
    let ended = Arc::new(AtomicBool::new(false));
    let replicated = store.config().log_keeper == LogKeeper::Replication;
    let in_flight = Arc::new(InFlight::new(replicated));
    let holders = PipeHolders::new(Arc::clone(&store));
    let writeback_interval = options.fs.writeback_cache;
    let push_helper = options.fs.push_helper.clone();
    let writeback = writeback_interval.map(|_| Writeback::new());
    let fs = TablixFs::new(
        Arc::clone(&store),
        options.fs,
        Arc::clone(&ended),
        Arc::clone(&in_flight),
        Arc::clone(&holders),
        refs.clone(),
        locks.clone(),
    )
    .with_writeback(writeback.clone());
    let session =
        fuser::spawn_mount(fs, &mountpoint, &config).map_err(|cause| MountError::Fuse {
            path: mountpoint.clone(),
            cause,
        })?;
    // Descriptors are matched to this mount by its id (see holders.rs).
    let mount_id = match mounted_at(&mountpoint) {
        Some(m) if m.fstype.starts_with("fuse") => {
            holders.set_mount_id(m.id);
            Some(m.id)
        }
        _ => {
            tracing::warn!(
                "{} is not in /proc/self/mountinfo: who holds a pipe end is not followed, nor (async mode) are the kernel's cached writes pushed",
                mountpoint.display()
            );
            None
        }
    };
    if replicated {
        // Changes this kernel did not see come from replication.
        let (tx, rx) = std::sync::mpsc::sync_channel(INVALIDATIONS_QUEUED);
        // The store asks, before answering a Command, whether it came
        // through this mount: those need no notice (the kernel saw them).
        let own = Arc::clone(&in_flight);
        store.watch_fs(tx, move |seed| own.contains(seed));
        let notifier = session.notifier();
        std::thread::Builder::new()
            .name("tablix-fuse-inval".into())
            .spawn(move || crate::invalidate::run(rx, notifier))
            .map_err(|cause| MountError::Fuse {
                path: mountpoint.clone(),
                cause,
            })?;
    }
    if let Some(locks) = &locks {
        locks
            .start_dropping(session.notifier())
            .map_err(|cause| MountError::Fuse {
                path: mountpoint.clone(),
                cause,
            })?;
        let locks = Arc::clone(locks);
        std::thread::Builder::new()
            .name("tablix-fuse-locks".into())
            .spawn(move || crate::locks::run(locks))
            .map_err(|cause| MountError::Fuse {
                path: mountpoint.clone(),
                cause,
            })?;
    }
    if let Some(refs) = &refs {
        let (refs, store) = (Arc::clone(refs), Arc::clone(&store));
        std::thread::Builder::new()
            .name("tablix-fuse-release".into())
            .spawn(move || crate::kernel_refs::run(refs, store))
            .map_err(|cause| MountError::Fuse {
                path: mountpoint.clone(),
                cause,
            })?;
    }
    let writeback = match (writeback, writeback_interval, mount_id) {
        (Some(wb), Some(interval), Some(mount_id)) => {
            let (w, root, store, ended, helper) = (
                Arc::clone(&wb),
                mountpoint.clone(),
                Arc::clone(&store),
                Arc::clone(&ended),
                push_helper,
            );
            let thread = std::thread::Builder::new()
                .name("tablix-fuse-writeback".into())
                .spawn(move || {
                    crate::writeback::run(w, (root, mount_id), (interval, helper), store, ended)
                })
                .map_err(|cause| MountError::Fuse {
                    path: mountpoint.clone(),
                    cause,
                })?;
            Some((wb, thread))
        }
        _ => None,
    };
    Ok(Mounted {
        session: Some(session),
        mountpoint,
        ended,
        holders,
        refs,
        locks,
        writeback,
    })
}

impl Mounted {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Who holds the mount's pipe ends: the process-table watcher hands it
    /// the processes that inherited some (`Store::apply_proc`'s answer).
    pub fn pipe_holders(&self) -> Arc<PipeHolders> {
        Arc::clone(&self.holders)
    }

    /// A flag that becomes true when the session ends, e.g. because
    /// someone ran umount on the mount point.
    pub fn ended(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.ended)
    }

    pub fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// Unmounts and waits for the request threads to finish. A mount still
    /// in use (open files, a shell inside) is detached lazily: it disappears
    /// from the namespace now and goes away with its last user.
    pub fn unmount(mut self) -> Result<(), MountError> {
        self.unmount_inner()
    }

    fn unmount_inner(&mut self) -> Result<(), MountError> {
        if let Some(refs) = &self.refs {
            refs.stop();
        }
        if let Some(locks) = &self.locks {
            locks.stop();
        }
        if let Some((wb, thread)) = self.writeback.take() {
            wb.stop();
            if thread.join().is_err() {
                tracing::error!("the writeback thread panicked");
            }
        }
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        if self.is_ended() {
            // Someone ran umount: the kernel ended the session and the
            // mount point is no longer ours to unmount.
            return session.join().map_err(|cause| MountError::Fuse {
                path: self.mountpoint.clone(),
                cause,
            });
        }
        match session.umount_and_join() {
            Ok(()) => Ok(()),
            Err(e) => {
                // Still in use (open files, a shell inside): detach it
                // lazily, so it leaves the namespace now and goes away with
                // its last user.
                tracing::warn!(
                    "unmounting {}: {e}; detaching it lazily",
                    self.mountpoint.display()
                );
                detach(&self.mountpoint).map_err(|reason| MountError::Stale {
                    path: self.mountpoint.clone(),
                    reason,
                })
            }
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = self.unmount_inner() {
            tracing::error!("unmounting: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_parse_with_escapes() {
        let text = "36 35 98:0 / /mnt/my\\040dir rw,noatime master:1 - fuse.tablix /data/x\\040y rw,user_id=0\n\
                    37 35 98:0 / /proc rw - proc proc rw\n";
        let entries = parse_mountinfo(text);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].point, PathBuf::from("/mnt/my dir"));
        assert_eq!(entries[0].fstype, "fuse.tablix");
        assert_eq!(entries[0].source, "/data/x y");
        assert_eq!(entries[1].fstype, "proc");
        assert_eq!(unescape("a\\134b"), "a\\b");
    }

    #[test]
    fn missing_and_non_directory_mount_points_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        assert!(matches!(prepare(&missing), Err(MountError::Missing(_))));
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(prepare(&file), Err(MountError::NotDirectory(_))));
        assert!(prepare(dir.path()).is_ok());
    }
}
