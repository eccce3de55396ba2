//! `tablix pipe`: named database-backed pipes on the mount.

use std::fs::OpenOptions;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::process::ExitCode;

use anyhow::bail;

use crate::cli::{PipeArgs, PipeCommand};
use crate::discovery;

pub fn run(args: PipeArgs) -> anyhow::Result<ExitCode> {
    match args.which {
        PipeCommand::Create {
            data,
            mode,
            capacity,
            name,
        } => {
            check_name(&name)?;
            let path = discovery::pipes_dir(data.as_deref())?.join(&name);
            // O_CREAT|O_EXCL on the pipes directory creates the pipe; the
            // descriptor (both ends) closes at once.
            match OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(&path)
            {
                Ok(_) => {
                    if let Some(bytes) = capacity
                        && let Err(e) = xattr::set(
                            &path,
                            std::ffi::OsStr::from_bytes(tablix_fuse::CAPACITY_XATTR),
                            bytes.to_string().as_bytes(),
                        )
                    {
                        let _ = std::fs::remove_file(&path);
                        bail!("setting the capacity of pipe {name:?} to {bytes}: {e}");
                    }
                    println!("{}", path.display());
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    bail!("a pipe named {name:?} exists ({})", path.display())
                }
                Err(e) => bail!("creating pipe {name:?}: {e}"),
            }
        }
        PipeCommand::Remove { data, name } => {
            check_name(&name)?;
            let path = discovery::pipes_dir(data.as_deref())?.join(&name);
            match std::fs::remove_file(&path) {
                Ok(()) => Ok(ExitCode::SUCCESS),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    bail!("no pipe named {name:?}")
                }
                Err(e) => bail!("removing pipe {name:?}: {e}"),
            }
        }
    }
}

fn check_name(name: &str) -> anyhow::Result<()> {
    if !tablix_pipe::schema::valid_name(name) {
        bail!(
            "invalid pipe name {name:?}: a file name of 1 to {} bytes, not . or .., without '/'",
            tablix_pipe::schema::MAX_NAME
        );
    }
    Ok(())
}
