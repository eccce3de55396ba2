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
//! the mount hangs with it. So the call runs in another process, which
//! holds no descriptor of the device (the daemon opens every descriptor
//! close-on-exec); the daemon's thread waits on a pipe, which a kill ends.
//! A dying daemon closes the device, the kernel fails the WRITEs, and the
//! other process's call returns. For the same reason the daemon's thread
//! makes no request of the mount itself: a request its threads read and
//! did not answer before they were killed is waited for uninterruptibly
//! too. It finds the mount in /proc/self/mountinfo, by the id it had when
//! mounted, and asks for no push once the mount left the path (the mount
//! point is then another file system's directory).
//!
//! That process is a helper kept for the mount ([`PushHelper`], the tablix
//! binary's hidden `push-writeback`, serving [`serve_pushes`]), started at
//! the first push and ended (its requests' pipe closed) when the mount
//! ends or the daemon dies: a push is then a request on a pipe, not a
//! process started every half interval for as long as a file stays open,
//! which an idle daemon holding one log file open paid about 3% of a core
//! for and the process table saw as ten new processes a second. Without a
//! helper (a program that links the mount), or while one cannot start,
//! each push runs `sync --file-system`. Either holds the root open only
//! for that call, so that an `umount` meets no descriptor.

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
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
    (interval, helper): (Duration, Option<PushHelper>),
    store: Arc<Store>,
    ended: Arc<AtomicBool>,
) {
    let period = (interval / 2).max(Duration::from_millis(1));
    let mut pusher = Pusher::new(helper);
    let mut failure_logged = false;
    while wb.tick(period) && !ended.load(Ordering::Acquire) {
        if wb.writers.load(Ordering::Relaxed) == 0 {
            continue;
        }
        let before = wb.writes.load(Ordering::Relaxed);
        match pusher.push(&root, mount_id) {
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

/// The program a mount keeps running for its pushes: started as
/// `program args...`, with `name` as its `argv[0]` (what `ps` shows), it
/// must serve [`serve_pushes`] on its standard input and output.
#[derive(Clone, Debug)]
pub struct PushHelper {
    pub program: PathBuf,
    pub name: OsString,
    pub args: Vec<OsString>,
}

/// The writeback thread's way to the kernel: the helper while it runs, or
/// `sync --file-system` per push without one.
struct Pusher {
    helper: Option<PushHelper>,
    running: Option<Running>,
    start_failure_logged: bool,
}

struct Running {
    child: Child,
    requests: ChildStdin,
    replies: BufReader<ChildStdout>,
}

impl Pusher {
    fn new(helper: Option<PushHelper>) -> Pusher {
        Pusher {
            helper,
            running: None,
            start_failure_logged: false,
        }
    }

    /// Has the kernel write back the dirty pages of the mount at `root`
    /// (mount id `mount_id`), from another process (the module's comment).
    fn push(&mut self, root: &Path, mount_id: u64) -> Result<(), String> {
        // Read from /proc, not asked of the mount.
        if crate::mount::mounted_at(root).is_none_or(|m| m.id != mount_id) {
            return Ok(());
        }
        self.push_at(root)
    }

    /// A push of the file system holding `root`.
    fn push_at(&mut self, root: &Path) -> Result<(), String> {
        let Some(helper) = &self.helper else {
            return sync_once(root);
        };
        let running = match &mut self.running {
            Some(running) => running,
            None => match start(helper) {
                Ok(started) => self.running.insert(started),
                // Pushed all the same, the slower way, until a helper starts.
                Err(e) => {
                    if !self.start_failure_logged {
                        self.start_failure_logged = true;
                        tracing::warn!("{e}; each push runs sync --file-system instead");
                    }
                    return sync_once(root);
                }
            },
        };
        match running.ask(root) {
            Ok(answer) => answer,
            Err(e) => {
                // A helper that died or garbled its answer is replaced at
                // the next push.
                let e = format!("the push helper {}: {e}", helper.program.display());
                if let Some(mut gone) = self.running.take() {
                    let _ = gone.child.kill();
                    let _ = gone.child.wait();
                }
                Err(e)
            }
        }
    }
}

impl Drop for Pusher {
    /// Ends the helper: it exits at the end of its requests.
    fn drop(&mut self) {
        if let Some(Running {
            mut child,
            requests,
            replies,
        }) = self.running.take()
        {
            drop(requests);
            drop(replies);
            let _ = child.wait();
        }
    }
}

fn start(helper: &PushHelper) -> Result<Running, String> {
    let mut child = Command::new(&helper.program)
        .arg0(&helper.name)
        .args(&helper.args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        // Its own process group: a terminal's Ctrl-C is the daemon's to
        // act on, and the daemon ends the helper as it stops.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("starting the push helper {}: {e}", helper.program.display()))?;
    match (child.stdin.take(), child.stdout.take()) {
        (Some(requests), Some(replies)) => Ok(Running {
            child,
            requests,
            replies: BufReader::new(replies),
        }),
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            Err("the push helper started without its pipes".to_owned())
        }
    }
}

impl Running {
    /// One push: the outer error is the helper's (it is replaced), the
    /// inner the push's.
    fn ask(&mut self, root: &Path) -> std::io::Result<Result<(), String>> {
        let mut request = root.as_os_str().as_bytes().to_vec();
        request.push(0);
        self.requests.write_all(&request)?;
        self.requests.flush()?;
        let mut answer = String::new();
        if self.replies.read_line(&mut answer)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "it ended without answering",
            ));
        }
        Ok(match answer.trim_end_matches('\n') {
            OK => Ok(()),
            why => Err(why.to_owned()),
        })
    }
}

/// A push helper's answer to a push that worked.
const OK: &str = "ok";

/// A push helper's loop: for each path read from `requests`, each ended
/// by a NUL byte, has the kernel write back the dirty pages of the file
/// system holding it (`syncfs(2)`), and answers with one line on
/// `replies`: `ok`, or why not. Returns at the end of `requests`.
pub fn serve_pushes(mut requests: impl BufRead, mut replies: impl Write) -> std::io::Result<()> {
    let mut path = Vec::new();
    loop {
        path.clear();
        if requests.read_until(0, &mut path)? == 0 {
            return Ok(());
        }
        if path.last() == Some(&0) {
            path.pop();
        }
        match syncfs_at(Path::new(OsStr::from_bytes(&path))) {
            Ok(()) => writeln!(replies, "{OK}")?,
            Err(why) => writeln!(replies, "{}", why.replace('\n', " "))?,
        }
        replies.flush()?;
    }
}

/// `syncfs(2)` of the file system holding `path`, opened only for the call.
fn syncfs_at(path: &Path) -> Result<(), String> {
    let dir = std::fs::File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    nix::unistd::syncfs(&dir).map_err(|e| format!("syncfs on {}: {e}", path.display()))
}

/// One push without a helper: `sync --file-system` in a child process.
fn sync_once(root: &Path) -> Result<(), String> {
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
    fn a_push_helper_answers_each_path_in_turn_and_ends_with_its_requests() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("missing");
        let mut requests = Vec::new();
        for path in [dir.path(), &missing, dir.path()] {
            requests.extend_from_slice(path.as_os_str().as_bytes());
            requests.push(0);
        }
        let mut replies = Vec::new();
        serve_pushes(&requests[..], &mut replies).expect("serving");
        let replies = String::from_utf8(replies).expect("text");
        let lines: Vec<&str> = replies.lines().collect();
        assert_eq!(lines.len(), 3, "{replies}");
        assert_eq!(lines[0], OK);
        assert!(
            lines[1].starts_with("opening ") && lines[1].contains("missing"),
            "{replies}"
        );
        assert_eq!(lines[2], OK);
    }

    #[test]
    fn a_mount_keeps_one_helper_for_its_pushes_and_ends_it_when_dropped() {
        // A shell standing in for the helper: it answers every request and
        // writes each down in a file.
        let dir = tempfile::tempdir().expect("temp dir");
        let count = dir.path().join("count");
        let script = format!(
            "while IFS= read -r -d '' p; do echo \"$p\" >> {}; echo {OK}; done",
            count.display()
        );
        let helper = PushHelper {
            program: PathBuf::from("/bin/bash"),
            name: OsString::from("push-helper-test"),
            args: vec!["-c".into(), script.into()],
        };
        let mut pusher = Pusher::new(Some(helper));
        let root = dir.path();
        let helper_pid = |p: &Pusher| p.running.as_ref().map(|r| r.child.id());
        assert_eq!(pusher.push_at(root), Ok(()));
        let first = helper_pid(&pusher).expect("a helper runs");
        for _ in 0..2 {
            assert_eq!(pusher.push_at(root), Ok(()));
            assert_eq!(helper_pid(&pusher), Some(first), "the same helper serves");
        }
        let pushes = std::fs::read_to_string(&count).expect("count");
        assert_eq!(pushes.lines().count(), 3, "{pushes}");

        // A helper that died fails one push and is replaced at the next.
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(first as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill");
        std::thread::sleep(Duration::from_millis(50));
        assert!(pusher.push_at(root).is_err());
        assert_eq!(helper_pid(&pusher), None);
        assert_eq!(pusher.push_at(root), Ok(()));
        let second = helper_pid(&pusher).expect("a new helper runs");
        assert_ne!(second, first);

        drop(pusher);
        assert!(
            !Path::new(&format!("/proc/{second}")).exists(),
            "the helper ended with its pusher"
        );

        // A helper that cannot start leaves each push to `sync`.
        let mut pusher = Pusher::new(Some(PushHelper {
            program: dir.path().join("no-such-helper"),
            name: OsString::from("push-helper-test"),
            args: Vec::new(),
        }));
        assert_eq!(pusher.push_at(root), Ok(()));
        assert_eq!(helper_pid(&pusher), None);
        assert!(pusher.start_failure_logged);
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
