//! `mount -t fuse.tablix DATA MOUNTPOINT -o OPTIONS`: mount(8) runs this
//! binary as `mount.fuse.tablix`, which starts `tablix up` in the background
//! and returns once the file system is mounted, so tablix can go into fstab.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};

use anyhow::{Context, bail};

/// The names this binary answers to as a mount helper.
pub const HELPER_NAMES: &[&str] = &["mount.fuse.tablix", "mount.tablix"];

/// Options mount(8) passes that concern mount(8) itself or the kernel's
/// defaults, not tablix.
const GENERIC: &[&str] = &[
    "rw", "defaults", "auto", "noauto", "user", "users", "nouser", "nofail", "_netdev", "suid",
    "nosuid", "dev", "nodev", "exec", "noexec", "atime", "noatime", "relatime", "async",
];

/// `tablix up` arguments for mount options, refusing unknown ones.
fn up_args(options: &str) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut http = false;
    for opt in options.split(',').filter(|o| !o.is_empty()) {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        match (key, value) {
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
                "unknown mount option {opt:?}; tablix takes mode=, http=, flush_interval_ms=, readers=, pcache=, fuse_threads=, allow_other and the generic mount options"
            ),
        }
    }
    if !http {
        // Several fstab mounts must not fight over one port; `tablix sql
        // --data DIR` finds the one chosen.
        out.extend(["--http".into(), "127.0.0.1:0".into()]);
    }
    Ok(out)
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
    let mut up = vec!["up".to_string(), "--data".into(), data.clone()];
    up.extend(up_args(&options)?);
    up.push(mountpoint.clone());
    let exe = std::env::current_exe().context("finding the tablix binary")?;
    std::fs::create_dir_all(data).with_context(|| format!("creating {data}"))?;
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
        let args = up_args("rw,noauto,mode=async,http=127.0.0.1:4100,allow_other").unwrap();
        assert_eq!(
            args,
            [
                "--mode",
                "async",
                "--http",
                "127.0.0.1:4100",
                "--allow-other"
            ]
        );
        let args = up_args("defaults").unwrap();
        assert_eq!(args, ["--http", "127.0.0.1:0"]);
        let err = up_args("rw,bogus=1").unwrap_err().to_string();
        assert!(err.contains("unknown mount option \"bogus=1\""), "{err}");
    }
}
