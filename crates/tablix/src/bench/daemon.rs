//! A `tablix up` daemon with a mount, started for one benchmark.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, bail};

/// Spawns `cmd` (a `tablix up`) with its standard output piped and waits
/// for its ready line: the child and its HTTP API's `host:port`. The
/// daemon stops when the thread that calls this exits (the benchmarks
/// call it from their main thread), also when a signal ends the process
/// before the benchmark could stop its daemons.
pub(crate) fn spawn_ready(cmd: &mut Command) -> anyhow::Result<(Child, String)> {
    let mut child = cmd
        .arg("--exit-with-parent")
        .stdout(Stdio::piped())
        .spawn()
        .context("starting tablix up")?;
    let mut line = String::new();
    let stdout = child.stdout.take().context("daemon stdout")?;
    BufReader::new(stdout).read_line(&mut line)?;
    let Some(http) = line
        .strip_prefix("tablix ready: http=http://")
        .and_then(|rest| rest.split_whitespace().next())
    else {
        let _ = child.kill();
        let _ = child.wait();
        bail!("the daemon did not start: {line:?}");
    };
    Ok((child, http.to_string()))
}

pub(crate) struct Daemon {
    child: Child,
    /// Where the file system is mounted.
    pub(crate) mount: PathBuf,
    /// The HTTP API, `host:port`.
    pub(crate) http: String,
}

impl Daemon {
    /// Starts a daemon on a fresh data directory `data`, mounted at `mnt`.
    pub(crate) fn start(
        data: &Path,
        mnt: &Path,
        mode: &str,
        extra: &[String],
    ) -> anyhow::Result<Daemon> {
        if data.exists() {
            std::fs::remove_dir_all(data)?;
        }
        std::fs::create_dir_all(mnt)?;
        let exe = std::env::current_exe()?;
        let (child, http) = spawn_ready(
            Command::new(exe)
                .args(["up", "--http", "127.0.0.1:0", "--mode", mode, "--data"])
                .arg(data)
                .args(extra)
                .arg(mnt)
                .env("TABLIX_LOG", "warn"),
        )?;
        Ok(Daemon {
            http,
            child,
            mount: mnt.to_path_buf(),
        })
    }

    /// The daemon's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the daemon (SIGTERM) and checks that it exited cleanly.
    pub(crate) fn stop(mut self) -> anyhow::Result<()> {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )?;
        let status = self.child.wait()?;
        if !status.success() {
            bail!("the daemon exited with {status}");
        }
        Ok(())
    }
}
