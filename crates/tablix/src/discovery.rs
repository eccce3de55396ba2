//! Finding the data directory and the daemon that serves it.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

/// `DATA/daemon.json`: written by a running daemon once it listens, removed
/// when it stops cleanly.
#[derive(Debug, Serialize, Deserialize)]
pub struct DaemonFile {
    pub pid: u32,
    pub http_addr: String,
    pub version: String,
    /// Where the file system is mounted, if it is.
    #[serde(default)]
    pub mount: Option<PathBuf>,
}

const FILE: &str = "daemon.json";

/// The data directory given, else `$TABLIX_DATA`, else the XDG data home.
pub fn data_dir(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(d) = given {
        return Ok(d.to_path_buf());
    }
    if let Some(d) = std::env::var_os("TABLIX_DATA").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("tablix"));
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".local/share/tablix")),
        None => bail!("no data directory: pass --data DIR or set TABLIX_DATA"),
    }
}

impl DaemonFile {
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let tmp = dir.join("daemon.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, dir.join(FILE))
            .with_context(|| format!("writing {}", dir.join(FILE).display()))?;
        Ok(())
    }

    pub fn remove(dir: &Path) {
        let _ = std::fs::remove_file(dir.join(FILE));
    }

    pub fn read(dir: &Path) -> Option<DaemonFile> {
        let text = std::fs::read(dir.join(FILE)).ok()?;
        serde_json::from_slice(&text).ok()
    }
}

/// The address of the daemon a client command should talk to.
pub fn daemon_addr(addr: Option<&str>, data: Option<&Path>) -> anyhow::Result<String> {
    if let Some(a) = addr {
        return Ok(a.to_string());
    }
    let dir = data_dir(data)?;
    match DaemonFile::read(&dir) {
        Some(f) => Ok(f.http_addr),
        None => bail!(
            "no tablix daemon is running for data directory {} (it has no {FILE}); start one with `tablix up --data {}` (or `make run`), or name one with --addr HOST:PORT",
            dir.display(),
            dir.display()
        ),
    }
}

/// The advice printed when a daemon found through discovery does not answer.
pub fn not_answering(addr: &str, data: Option<&Path>) -> String {
    let dir = data_dir(data)
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    format!(
        "no tablix daemon is answering at {addr} (recorded in {dir}/{FILE}, probably left by a daemon that was killed); start one with `tablix up --data {dir}` (or `make run`)"
    )
}

/// The pipes directory of the running daemon's mount, or a clear error
/// saying why there is none.
pub fn pipes_dir(data: Option<&Path>) -> anyhow::Result<PathBuf> {
    let dir = data_dir(data)?;
    let Some(daemon) = DaemonFile::read(&dir) else {
        bail!(
            "tablix is not running for {} (no daemon.json); start it with `tablix up MOUNTPOINT`",
            dir.display()
        );
    };
    let Some(mount) = daemon.mount else {
        bail!(
            "the tablix daemon (pid {}) of {} has no file system mounted; start it with `tablix up MOUNTPOINT`",
            daemon.pid,
            dir.display()
        );
    };
    let pipes = mount.join(".tablix").join("pipes");
    match std::fs::metadata(&pipes) {
        Ok(m) if m.is_dir() => Ok(pipes),
        Ok(_) => bail!("{} is not the tablix pipes directory", pipes.display()),
        Err(e) => bail!(
            "the tablix mount at {} is not answering ({e}); is the daemon (pid {}) running?",
            mount.display(),
            daemon.pid
        ),
    }
}
