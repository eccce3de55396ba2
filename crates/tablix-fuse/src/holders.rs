//! Which processes hold which pipe ends: `pid_pipe` kept true to /proc.
//!
//! The kernel tells a FUSE daemon when an open file description is made
//! (OPEN) and when its last descriptor goes (RELEASE), but not who shares
//! it: `fork` copies descriptors and `dup` makes more, silently. What it
//! does report is each `close` of a descriptor, with the closer's pid
//! (FLUSH, including the closes of `exec` and `exit`), and the process
//! table sees every fork. So:
//!
//! * OPEN: the opener holds the new end (`PipeOp::Open`);
//! * fork: the child holds what its parent holds (applied with the process
//!   table's batch, `tablix_pipe::forked`), then its descriptors are read;
//! * FLUSH of a pipe file: the closer's descriptors are read
//!   (`/proc/PID/fdinfo`: the mount and inode of each open file and its
//!   access mode), and `PipeOp::Holds` records what it still holds. A
//!   process that gave an end up has its children read too: they may have
//!   inherited it before their fork reached the process table;
//! * exit: the process holds nothing (`tablix_pipe::exited`).
//!
//! Reading a process's descriptors and recording them happen under one
//! lock, so records are made in the order the reads were.
//!
//! What is not followed: a descriptor received over a Unix socket, until
//! its holder next closes a pipe file or forks; processes whose /proc this
//! daemon may not read (an unprivileged daemon and other users'
//! processes); processes in another mount namespace (their copy of the
//! mount has another id); and without the kernel's process events (the
//! process table polling /proc), forks.

use std::io::ErrorKind;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tablix_pipe::{End, PipeOp, PipeReply};
use tablix_store::{Stamp, Store};

use crate::pipes::pipe_of;

/// Most descriptors of one process read at a FLUSH; a process with more is
/// left as it was recorded.
const MAX_FDS: usize = 65_536;

/// Follows who holds pipe ends; shared by the mount's pipe engine and the
/// process-table watcher.
pub struct PipeHolders {
    store: Arc<Store>,
    /// The mount's id, as /proc/PID/fdinfo shows it (0: not known yet).
    mount_id: AtomicU64,
    /// Held from reading a process's descriptors until they are recorded.
    serial: Mutex<()>,
}

/// A task's process (thread group) and that process's parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProcessOf {
    pub(crate) pid: u32,
    pub(crate) parent: Option<u32>,
}

impl ProcessOf {
    /// The process of task `tid` (itself if /proc cannot say).
    pub(crate) fn read(tid: u32) -> ProcessOf {
        std::fs::read_to_string(format!("/proc/{tid}/status"))
            .ok()
            .and_then(|s| parse_status(&s))
            .unwrap_or(ProcessOf {
                pid: tid,
                parent: None,
            })
    }
}

impl PipeHolders {
    pub(crate) fn new(store: Arc<Store>) -> Arc<PipeHolders> {
        Arc::new(PipeHolders {
            store,
            mount_id: AtomicU64::new(0),
            serial: Mutex::new(()),
        })
    }

    pub(crate) fn set_mount_id(&self, id: u64) {
        self.mount_id.store(id, Ordering::Release);
    }

    /// Reads what task `tid`'s process holds and records it; see the module
    /// documentation.
    pub fn sync(&self, tid: u32) {
        let _serial = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        let process = ProcessOf::read(tid);
        let gave_up = self.sync_locked(process);
        if gave_up {
            for child in children(process.pid) {
                self.sync_locked(ProcessOf {
                    pid: child,
                    parent: Some(process.pid),
                });
            }
        }
    }

    /// Records what `process` holds now; returns whether it gave any end up.
    fn sync_locked(&self, process: ProcessOf) -> bool {
        let mount_id = self.mount_id.load(Ordering::Acquire);
        if mount_id == 0 {
            return false;
        }
        let held = match held_ends(process.pid, mount_id) {
            Ok(Some(held)) => held,
            Ok(None) => return false,
            Err(e) => {
                tracing::debug!("reading the descriptors of process {}: {e}", process.pid);
                return false;
            }
        };
        tracing::debug!("process {} holds {held:?}", process.pid);
        let op = PipeOp::Holds {
            pid: process.pid,
            parent: process.parent,
            held,
        };
        match self.store.apply_pipe(Stamp::now(), &op) {
            Ok(Ok(PipeReply::Held { removed, .. })) => removed > 0,
            Ok(Ok(_)) => false,
            Ok(Err(e)) => {
                tracing::warn!("recording the pipe ends of process {}: {e}", process.pid);
                false
            }
            Err(e) => {
                tracing::warn!("recording the pipe ends of process {}: {e}", process.pid);
                false
            }
        }
    }
}

/// The pipe ends process `pid` holds, from its descriptors on the mount
/// `mount_id`: `Ok(None)` when they cannot be known (not ours to read, or
/// too many descriptors); an empty list when the process is gone or has
/// none (an exiting process's descriptor table is already gone).
fn held_ends(pid: u32, mount_id: u64) -> std::io::Result<Option<Vec<(i64, End)>>> {
    let dir = match std::fs::read_dir(format!("/proc/{pid}/fdinfo")) {
        Ok(d) => d,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Some(Vec::new())),
        Err(e) if e.kind() == ErrorKind::PermissionDenied => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut held = Vec::new();
    for (n, entry) in dir.enumerate() {
        if n >= MAX_FDS {
            return Ok(None);
        }
        let entry = match entry {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Some(Vec::new())),
            Err(e) => return Err(e),
        };
        let text = match std::fs::read_to_string(entry.path()) {
            Ok(t) => t,
            // Closed since the listing.
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) if e.kind() == ErrorKind::PermissionDenied => return Ok(None),
            Err(e) => return Err(e),
        };
        if let Some(info) = parse_fdinfo(&text)
            && info.mount_id == mount_id
            && let Some(pipe) = pipe_of(info.ino)
        {
            let end = crate::pipes::end_of(info.flags);
            if !held.contains(&(pipe, end)) {
                held.push((pipe, end));
            }
        }
    }
    held.sort_by_key(|&(pipe, end)| (pipe, end as u8));
    Ok(Some(held))
}

/// The children of every thread of process `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(
                text.split_ascii_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
    }
    out
}

/// What one /proc/PID/fdinfo/FD says about the open file.
#[derive(Debug, PartialEq, Eq)]
struct FdInfo {
    mount_id: u64,
    ino: u64,
    flags: i32,
}

fn parse_fdinfo(text: &str) -> Option<FdInfo> {
    let (mut mount_id, mut ino, mut flags) = (None, None, None);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key {
            "mnt_id" => mount_id = value.parse().ok(),
            "ino" => ino = value.parse().ok(),
            "flags" => flags = i32::from_str_radix(value, 8).ok(),
            _ => {}
        }
    }
    Some(FdInfo {
        mount_id: mount_id?,
        ino: ino?,
        flags: flags?,
    })
}

fn parse_status(text: &str) -> Option<ProcessOf> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u32>().ok())
    };
    Some(ProcessOf {
        pid: field("Tgid:")?,
        parent: field("PPid:").filter(|&p| p != 0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fdinfo_and_status_are_parsed() {
        let info = parse_fdinfo("pos:\t0\nflags:\t0100001\nmnt_id:\t57\nino:\t562949953421319\n");
        assert_eq!(
            info,
            Some(FdInfo {
                mount_id: 57,
                ino: 562_949_953_421_319,
                flags: 0o100001,
            })
        );
        assert_eq!(crate::pipes::end_of(0o100001), End::Write);
        assert_eq!(parse_fdinfo("pos:\t0\nflags:\t02\n"), None, "no mount id");
        let status = "Name:\tsh\nTgid:\t812\nNgid:\t0\nPid:\t815\nPPid:\t700\n";
        assert_eq!(
            parse_status(status),
            Some(ProcessOf {
                pid: 812,
                parent: Some(700)
            })
        );
        assert_eq!(
            parse_status("Tgid:\t1\nPPid:\t0\n").unwrap().parent,
            None,
            "init has no parent"
        );
    }

    #[test]
    fn this_process_is_read_from_proc() {
        let me = ProcessOf::read(std::process::id());
        assert_eq!(me.pid, std::process::id());
        assert_eq!(me.parent, Some(std::os::unix::process::parent_id()));
        // The descriptors of this process on a mount id no mount has:
        // none is a pipe end of it.
        assert_eq!(
            held_ends(std::process::id(), u64::MAX).unwrap(),
            Some(vec![])
        );
        // A process that is gone holds nothing.
        assert_eq!(held_ends(u32::MAX - 1, 1).unwrap(), Some(vec![]));
    }
}
