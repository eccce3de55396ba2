//! `tablix sql`.

use std::io::{BufRead, IsTerminal};
use std::process::ExitCode;

use anyhow::Context;
use tablix_shell::{ClientError, Mode, Shell, ShellError};

use crate::cli::SqlArgs;
use crate::discovery;

pub fn run(args: SqlArgs) -> anyhow::Result<ExitCode> {
    let mode: Mode = args.mode.parse().map_err(anyhow::Error::msg)?;
    let (client, discovered) = discovery::client(
        args.addr.as_deref(),
        args.data.as_deref(),
        args.user.as_deref(),
        args.ca_cert.as_deref(),
    )?;
    if let Err(e) = client.ping() {
        return Err(match e {
            ClientError::Unreachable { .. } if discovered => anyhow::anyhow!(
                discovery::not_answering(&client.addr(), args.data.as_deref())
            ),
            other => other.into(),
        });
    }
    // On a cluster, the other nodes take over if this one goes away.
    client.learn_cluster();
    let mut shell = Shell::new(client, std::io::stdout().lock());
    shell.set_mode(mode);
    shell.set_headers(args.headers);

    let mut ran_something = false;
    if let Some(file) = &args.file {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        if let Some(code) = batch(&mut shell, &text) {
            return Ok(code);
        }
        ran_something = true;
    }
    if !args.sql.is_empty() {
        let mut text = String::new();
        for arg in &args.sql {
            text.push_str(arg);
            if !arg.trim_end().ends_with(';') && !arg.trim_start().starts_with('.') {
                text.push(';');
            }
            text.push('\n');
        }
        if let Some(code) = batch(&mut shell, &text) {
            return Ok(code);
        }
        ran_something = true;
    }
    let stdin = std::io::stdin();
    if args.interactive || (!ran_something && stdin.is_terminal()) {
        let history =
            std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".tablix_history"));
        shell.repl(history.as_deref())?;
    } else if !ran_something {
        // Statements run as their lines arrive: a program writing to the
        // pipe may read each answer before it writes the next.
        let lines = stdin.lock().lines().map(|l| l.map(|l| l + "\n"));
        if let Some(code) = report(shell.run_lines(lines)) {
            return Ok(code);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs a batch; on error prints it and returns the exit code to leave with.
fn batch<W: std::io::Write>(shell: &mut Shell<W>, text: &str) -> Option<ExitCode> {
    report(shell.run_batch(text))
}

/// A batch's end: on error it is printed, and the exit code to leave
/// with returned. An output closed by its reader (`tablix sql ... | head`)
/// ends quietly, with the status a process killed by SIGPIPE has.
fn report(r: Result<(), ShellError>) -> Option<ExitCode> {
    match r {
        Err(ShellError::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            Some(ExitCode::from(141))
        }
        Ok(()) => None,
        Err(ShellError::Quit) => Some(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("Error: {e}");
            Some(ExitCode::FAILURE)
        }
    }
}
