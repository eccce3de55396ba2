//! Finding the data directory and the daemon that serves it.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use tablix_shell::Client;

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
    /// The Unix socket local clients use.
    #[serde(default)]
    pub socket: Option<PathBuf>,
}

const FILE: &str = "daemon.json";

/// The daemon's Unix socket in a data directory.
pub const SOCKET: &str = "tablix.sock";

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

    /// The daemon file of `dir`, if there is one and it reads.
    pub fn read(dir: &Path) -> Option<DaemonFile> {
        let bytes = std::fs::read(dir.join(FILE)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

/// How a client command reaches the daemon: over TCP when `addr` names
/// one, else over the Unix socket of the data directory's daemon. Returns
/// the client and whether it was found by discovery.
pub fn client(
    addr: Option<&str>,
    data: Option<&Path>,
    user: Option<&str>,
    ca: Option<&Path>,
) -> anyhow::Result<(Client, bool)> {
    let client = match addr {
        Some(a) => Client::tcp(a, ca)?,
        None => {
            let dir = data_dir(data)?;
            let socket = dir.join(SOCKET);
            if !socket.exists() {
                bail!(
                    "no tablix daemon is running for data directory {} (it has no {SOCKET}); start one with `tablix up --data {}` (or `make run`), or name one with --addr HOST:PORT",
                    dir.display(),
                    dir.display()
                );
            }
            Client::unix(socket)?
        }
    };
    let client = match user {
        None => client,
        Some(u) => {
            let (name, password) = match u.split_once(':') {
                Some((n, p)) => (n.to_string(), p.to_string()),
                None => match std::env::var("TABLIX_PASSWORD") {
                    Ok(p) => (u.to_string(), p),
                    Err(_) => bail!(
                        "--user {u} needs a password: --user {u}:PASSWORD, or set TABLIX_PASSWORD"
                    ),
                },
            };
            client.with_credentials(&name, &password)
        }
    };
    Ok((client, addr.is_none()))
}

/// The advice printed when a daemon found through discovery does not answer.
pub fn not_answering(addr: &str, data: Option<&Path>) -> String {
    let dir = data_dir(data)
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    format!(
        "no tablix daemon is answering at {addr} (probably left by a daemon that was killed); start one with `tablix up --data {dir}` (or `make run`)"
    )
}

/// The pipes directory of the running daemon's mount, asked of the daemon
/// over its socket, or a clear error saying why there is none.
pub fn pipes_dir(data: Option<&Path>) -> anyhow::Result<PathBuf> {
    let dir = data_dir(data)?;
    let socket = dir.join(SOCKET);
    if !socket.exists() {
        bail!(
            "tablix is not running for {} (no {SOCKET}); start it with `tablix up MOUNTPOINT`",
            dir.display()
        );
    }
    let status = Client::unix(&socket)?
        .get_json("/status")
        .map_err(|e| anyhow::anyhow!("{e}; is the daemon of {} running?", dir.display()))?;
    let pid = status["tablix"]["pid"].as_u64().unwrap_or(0);
    let Some(mount) = status["tablix"]["mount"].as_str().map(PathBuf::from) else {
        bail!(
            "the tablix daemon (pid {pid}) of {} has no file system mounted; start it with `tablix up MOUNTPOINT`",
            dir.display()
        );
    };
    let pipes = mount.join(".tablix").join("pipes");
    match std::fs::metadata(&pipes) {
        Ok(m) if m.is_dir() => Ok(pipes),
        Ok(_) => bail!("{} is not the tablix pipes directory", pipes.display()),
        Err(e) => bail!(
            "the tablix mount at {} is not answering ({e}); is the daemon (pid {pid}) running?",
            mount.display()
        ),
    }
}
