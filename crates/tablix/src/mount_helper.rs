//! `mount -t fuse.tablix DATA MOUNTPOINT -o OPTIONS`: mount(8) runs this
//! binary as `mount.fuse.tablix`, which starts `tablix up` in the background
//! and returns once the file system is mounted, so tablix can go into fstab.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::discovery::DaemonFile;

/// The names this binary answers to as a mount helper.
pub const HELPER_NAMES: &[&str] = &["mount.fuse.tablix", "mount.tablix"];

/// Options mount(8) passes that concern mount(8) itself or the kernel's
/// defaults, not tablix.
const GENERIC: &[&str] = &[
    "rw", "defaults", "auto", "noauto", "user", "users", "nouser", "nofail", "_netdev", "suid",
    "nosuid", "dev", "nodev", "exec", "noexec", "atime", "noatime", "relatime", "async",
];

/// What mount options ask of the helper.
#[derive(Debug, Default, PartialEq)]
struct Asked {
    /// `tablix up`'s arguments.
    up: Vec<String>,
    /// `ro`: the mount is made read-only once the daemon mounted it.
    read_only: bool,
    /// `remount`: the options go to the kernel's mount, no daemon starts.
    remount: bool,
}

/// Reads mount options, refusing unknown ones.
fn asked(options: &str) -> anyhow::Result<Asked> {
    let mut asked = Asked::default();
    let mut http = false;
    let mut own = Vec::new();
    for opt in options.split(',').filter(|o| !o.is_empty()) {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let out = &mut asked.up;
        match (key, value) {
            ("ro", None) => asked.read_only = true,
            ("remount", None) => asked.remount = true,
            (k, None) if GENERIC.contains(&k) => {}
            ("x-systemd.automount" | "x-systemd.requires", _) => {}
            (k, _) if k.starts_with("x-") || k.starts_with("comment=") => {}
            ("allow_other", None) => out.push("--allow-other".into()),
            ("mode", Some(v)) => out.extend(["--mode".into(), v.into()]),
            ("http", Some(v)) => {
                http = true;
                out.extend(["--http".into(), v.into()]);
            }
            ("flush_interval_ms", Some(v)) => out.extend(["--flush-interval-ms".into(), v.into()]),
            ("readers", Some(v)) => out.extend(["--readers".into(), v.into()]),
            ("pcache", Some(v)) => out.extend(["--pcache".into(), v.into()]),
            ("fuse_threads", Some(v)) => out.extend(["--fuse-threads".into(), v.into()]),
            _ => bail!(
                "unknown mount option {opt:?}; tablix takes mode=, http=, flush_interval_ms=, readers=, pcache=, fuse_threads=, allow_other, ro and the generic mount options"
            ),
        }
        let tablix_own = [
            "allow_other",
            "mode",
            "http",
            "flush_interval_ms",
            "readers",
            "pcache",
            "fuse_threads",
        ];
        if tablix_own.contains(&key) {
            own.push(opt);
        }
    }
    if asked.remount {
        if !own.is_empty() {
            bail!(
                "{} cannot change on a mounted tablix: unmount and mount again",
                own.join(",")
            );
        }
        asked.up.clear();
    } else if !http {
        // Several fstab mounts must not fight over one port; `tablix sql
        // --data DIR` finds the one chosen.
        asked.up.extend(["--http".into(), "127.0.0.1:0".into()]);
    }
    Ok(asked)
}

/// The kernel's own mount (`mount -i`: no helper) of `mountpoint` with
/// `options`, for a remount.
fn kernel_mount(options: &str, mountpoint: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("mount")
        .args(["-i", "-o", options, mountpoint])
        .status()
        .context("running mount")?;
    if !status.success() {
        bail!("mount -o {options} {mountpoint} failed ({status})");
    }
    Ok(())
}

/// Waits, up to [`STOPPING_WAIT`], while a daemon that is stopping (its
/// file system unmounted, its store still closing) holds `data`: a mount
/// right after an unmount must not find the directory in use. A daemon
/// that still serves its mount is not waited for; `tablix up` then says
/// the directory is in use.
fn wait_for_stopping_daemon(data: &Path) {
    let deadline = Instant::now() + STOPPING_WAIT;
    while Instant::now() < deadline && stopping(data, &mounts()) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How long a mount waits for a stopping daemon of its data directory.
const STOPPING_WAIT: Duration = Duration::from_secs(30);

/// Whether the holder of `data`'s lock is stopping: its daemon file is
/// gone (removed as it begins to stop) or names a mount point that is no
/// longer among `mounts`.
fn stopping(data: &Path, mounts: &[PathBuf]) -> bool {
    held(data)
        && DaemonFile::read(data).is_none_or(|f| f.mount.is_some_and(|m| !mounts.contains(&m)))
}

/// The mount points of this process's mount namespace.
fn mounts() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mountinfo(m)))
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes
            .get(i + 1..i + 4)
            .filter(|_| bytes[i] == b'\\')
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match code {
            Some(b) => {
                out.push(b);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a process holds `DATA/LOCK` (the store's lock on the directory).
fn held(data: &Path) -> bool {
    let Ok(file) = std::fs::File::open(data.join("LOCK")) else {
        return false;
    };
    matches!(
        file.try_lock_shared(),
        Err(std::fs::TryLockError::WouldBlock)
    )
}

pub fn run(args: &[String]) -> anyhow::Result<ExitCode> {
    let mut positional = Vec::new();
    let mut options = String::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => {
                let o = it.next().context("-o needs an option list")?;
                if !options.is_empty() {
                    options.push(',');
                }
                options.push_str(o);
            }
            // mount(8)'s own flags: fake, no-mtab, sloppy, verbose.
            "-f" | "-n" | "-s" | "-v" => {}
            s if s.starts_with('-') => bail!("unknown flag {s}"),
            _ => positional.push(a.clone()),
        }
    }
    let [data, mountpoint] = positional.as_slice() else {
        bail!("usage: mount.fuse.tablix DATA_DIR MOUNTPOINT [-o OPTIONS]");
    };
    let asked = asked(&options)?;
    if asked.remount {
        kernel_mount(&options, mountpoint)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut up = vec!["up".to_string(), "--data".into(), data.clone()];
    up.extend(asked.up);
    up.push(mountpoint.clone());
    let exe = std::env::current_exe().context("finding the tablix binary")?;
    std::fs::create_dir_all(data).with_context(|| format!("creating {data}"))?;
    wait_for_stopping_daemon(Path::new(data));
    let log_path = PathBuf::from(data).join("daemon.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(&up)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log));
    // The daemon outlives mount(8): its own session, no controlling terminal.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().context("starting tablix up")?;
    let stdout = child.stdout.take().context("no stdout from tablix up")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if line.starts_with("tablix ready") {
        if asked.read_only {
            kernel_mount("remount,ro", mountpoint)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let status = child.wait()?;
    let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
    let tail: Vec<&str> = tail.lines().rev().take(5).collect();
    bail!(
        "tablix up exited ({status}) before mounting:\n{}",
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_options_become_up_flags() {
        let a = asked("rw,noauto,mode=async,http=127.0.0.1:4100,allow_other").unwrap();
        assert_eq!(
            a.up,
            [
                "--mode",
                "async",
                "--http",
                "127.0.0.1:4100",
                "--allow-other"
            ]
        );
        assert!(!a.read_only && !a.remount);
        let a = asked("defaults").unwrap();
        assert_eq!(a.up, ["--http", "127.0.0.1:0"]);
        let err = asked("rw,bogus=1").unwrap_err().to_string();
        assert!(err.contains("unknown mount option \"bogus=1\""), "{err}");
    }

    #[test]
    fn ro_is_a_remount_after_the_daemon_mounted_and_remount_starts_no_daemon() {
        let a = asked("ro,mode=async").unwrap();
        assert!(a.read_only && !a.remount);
        assert_eq!(a.up, ["--mode", "async", "--http", "127.0.0.1:0"]);
        let a = asked("remount,ro,x-gvfs-hide").unwrap();
        assert!(a.remount && a.read_only);
        assert!(a.up.is_empty(), "{:?}", a.up);
        let err = asked("remount,rw,mode=async").unwrap_err().to_string();
        assert!(err.contains("mode=async cannot change"), "{err}");
    }

    #[test]
    fn a_stopping_daemon_is_waited_for_and_a_serving_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let mnt = dir.path().join("mnt");
        let daemon =
            |mount: &str| format!(r#"{{"pid":1,"http_addr":"x","version":"x","mount":"{mount}"}}"#);
        assert!(!held(dir.path()), "no LOCK file: nobody holds it");
        assert!(!stopping(dir.path(), &[]));
        let lock = std::fs::File::create(dir.path().join("LOCK")).unwrap();
        lock.lock().unwrap();
        assert!(held(dir.path()));
        std::fs::write(
            dir.path().join("daemon.json"),
            daemon(&mnt.display().to_string()),
        )
        .unwrap();
        assert!(
            !stopping(dir.path(), std::slice::from_ref(&mnt)),
            "serving its mount"
        );
        assert!(stopping(dir.path(), &[]), "its mount is gone");
        std::fs::remove_file(dir.path().join("daemon.json")).unwrap();
        assert!(
            stopping(dir.path(), std::slice::from_ref(&mnt)),
            "its daemon file is gone"
        );
        // Waits until the lock goes.
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(lock);
        });
        let started = Instant::now();
        wait_for_stopping_daemon(dir.path());
        let waited = started.elapsed();
        release.join().unwrap();
        assert!(!held(dir.path()));
        assert!(waited >= Duration::from_millis(250), "{waited:?}");
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mountinfo(r"/mnt/a\040b\011c"), "/mnt/a b\tc");
        assert_eq!(unescape_mountinfo(r"/plain\"), "/plain\\");
    }
}
