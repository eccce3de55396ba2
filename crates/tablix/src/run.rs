//! `tablix run -- CMD ARGS...`: the command's pipes go through the database.

use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};

use crate::cli::RunArgs;
use crate::discovery;

/// The preload library, built from shim/pipe_preload.c by build.rs.
const PRELOAD: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libtablix_preload.so"));

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let pipes = discovery::pipes_dir(args.data.as_deref())?;
    let library = install_preload()?;
    let Some((program, rest)) = args.command.split_first() else {
        bail!("no command given: tablix run -- CMD ARGS...");
    };
    let mut preload = library.display().to_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload = format!("{preload}:{}", old.to_string_lossy());
    }
    let err = std::process::Command::new(program)
        .args(rest)
        .env("LD_PRELOAD", preload)
        .env("TABLIX_PIPE_DIR", &pipes)
        .exec();
    bail!("cannot run {program:?}: {err}")
}

/// Writes the library where every user can load it, once per content.
fn install_preload() -> anyhow::Result<PathBuf> {
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let hash = PRELOAD.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let path = base.join(format!(
        "tablix-preload-{}-{hash:016x}.so",
        nix::unistd::getuid()
    ));
    if std::fs::read(&path).is_ok_and(|have| have == PRELOAD) {
        return Ok(path);
    }
    // A fresh file (never through a link someone left in a shared
    // directory), renamed into place.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o755)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::io::Write::write_all(&mut file, PRELOAD)
        .with_context(|| format!("writing {}", tmp.display()))?;
    drop(file);
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}
