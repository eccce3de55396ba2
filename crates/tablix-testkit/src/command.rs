//! Commands a test runs, each within a time limit: a command that hangs
//! (on a file system that stopped answering, say) fails its test and
//! says where each of its processes waits, instead of hanging the whole
//! test run until CI gives up on it.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long any one command a test runs may take. Three SQLite clients
/// taking turns through the cross-node locks of three daemons, beside the
/// other daemon tests on a disk that syncs in about 355 us, took over
/// 120 s.
pub const COMMAND_LIMIT: Duration = Duration::from_secs(300);

/// The child's exit status once it exits, or `None` after `limit`.
pub fn wait_for_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(status) = child.try_wait().expect("waiting for a child") {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Runs `cmd` with `stdin` as its input, in a process group of its own.
/// Past [`COMMAND_LIMIT`] the group is killed and the test fails, showing
/// each process of the group with the kernel function it waits in.
pub fn output_within(cmd: &mut Command, stdin: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let feed = {
        let (mut to, input) = (child.stdin.take(), stdin.to_vec());
        std::thread::spawn(move || {
            if let Some(to) = to.as_mut() {
                let _ = to.write_all(&input);
            }
        })
    };
    let reader = |from: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut all = Vec::new();
            if let Some(mut from) = from {
                let _ = from.read_to_end(&mut all);
            }
            all
        })
    };
    let out = reader(
        child
            .stdout
            .take()
            .map(|o| Box::new(o) as Box<dyn Read + Send>),
    );
    let err = reader(
        child
            .stderr
            .take()
            .map(|e| Box::new(e) as Box<dyn Read + Send>),
    );
    let Some(status) = wait_for_exit(&mut child, COMMAND_LIMIT) else {
        let group = child.id().to_string();
        let ps = Command::new("ps")
            .args(["-eo", "pgid,pid,stat,wchan:32,args"])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter(|l| l.split_whitespace().next() == Some(group.as_str()))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default();
        let _ = kill(Pid::from_raw(-(child.id() as i32)), Signal::SIGKILL);
        let _ = child.wait();
        panic!("{cmd:?} still running after {COMMAND_LIMIT:?}; its processes:\n{ps}");
    };
    let _ = feed.join();
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// `Command::output` within [`COMMAND_LIMIT`], through [`output_within`]
/// with no input.
pub trait Limited {
    fn output_limited(&mut self) -> Output;
}

impl Limited for Command {
    fn output_limited(&mut self) -> Output {
        output_within(self, b"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_within_passes_input_and_returns_both_streams_and_the_status() {
        let o = output_within(
            Command::new("sh").args(["-c", "tr a-z A-Z; echo err >&2; exit 3"]),
            b"piped in",
        );
        assert_eq!(o.stdout, b"PIPED IN");
        assert_eq!(o.stderr, b"err\n");
        assert_eq!(o.status.code(), Some(3));
    }
}
