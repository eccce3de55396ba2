//! The cost of one FUSE request on this machine, measured on the daemon
//! under test: a `getxattr` of an absent attribute on a file of the mount
//! is one request whose answer is one indexed read, so its round trip is
//! almost all transport (the system call, the kernel queueing the request,
//! waking a daemon thread, the reply waking the caller).
//!
//! On a small virtual machine that cost depends on where the daemon's
//! threads run relative to the caller: on the caller's CPU a wake-up is a
//! context switch, on another CPU an inter-processor interrupt and a
//! halted virtual CPU to wake. The probe pins the caller to CPU 0 and the
//! daemon's threads to CPU 0, to CPU 1, and to every CPU in turn.
//!
//! Every request-per-operation workload is bounded below by requests x
//! round trip, whatever the file system does with them; the benchmarks
//! print the probe next to their figures so that bound is in the same run.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};

use crate::bench::median;

/// Median microseconds per request, per placement of the daemon's threads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RoundTrip {
    pub(crate) same_cpu: f64,
    pub(crate) other_cpu: f64,
    pub(crate) free: f64,
}

impl RoundTrip {
    pub(crate) fn print(&self) {
        println!(
            "FUSE request round trip (getxattr on the mount, caller on CPU 0), us: daemon on the same CPU {:.1}, on the other CPU {:.1}, scheduler's choice {:.1}",
            self.same_cpu, self.other_cpu, self.free
        );
    }
}

fn cpu_set(cpus: &[usize]) -> anyhow::Result<nix::sched::CpuSet> {
    let mut set = nix::sched::CpuSet::new();
    for &c in cpus {
        set.set(c)?;
    }
    Ok(set)
}

/// Sets the CPU affinity of every thread of process `pid`.
fn pin_process(pid: u32, cpus: &[usize]) -> anyhow::Result<()> {
    let set = cpu_set(cpus)?;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("listing the threads of process {pid}"))?;
    for task in tasks {
        let Some(tid) = task?
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        // A thread that exited meanwhile (ESRCH) no longer matters.
        match nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(tid), &set) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => bail!("pinning thread {tid} of the daemon: {e}"),
        }
    }
    Ok(())
}

/// Sets the CPU affinity of the calling thread.
pub(crate) fn pin_self(cpus: &[usize]) -> anyhow::Result<()> {
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &cpu_set(cpus)?)?;
    Ok(())
}

/// Microseconds per `getxattr` of `file`, over `n` calls.
fn time_requests(file: &Path, n: usize) -> anyhow::Result<f64> {
    let start = Instant::now();
    for _ in 0..n {
        if xattr::get(file, "user.tablix.bench-probe")
            .with_context(|| format!("getxattr on {}", file.display()))?
            .is_some()
        {
            bail!("{} unexpectedly has the probe attribute", file.display());
        }
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// Probes the daemon `pid` serving the mount at `mount`: `n` requests per
/// run, medians of `repeat` runs per placement. Needs two CPUs; leaves the
/// daemon and the calling thread free to run anywhere afterwards.
pub(crate) fn probe(pid: u32, mount: &Path, n: usize, repeat: usize) -> anyhow::Result<RoundTrip> {
    let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))?;
    let cpus: Vec<usize> = (0..nix::sched::CpuSet::count())
        .filter(|&c| allowed.is_set(c).unwrap_or(false))
        .collect();
    if cpus.len() < 2 || cpus[0] != 0 || cpus[1] != 1 {
        bail!("the transport probe needs CPUs 0 and 1 (this process may use {cpus:?})");
    }
    let file = mount.join(format!(".bench-probe-{}", std::process::id()));
    std::fs::write(&file, b"probe").with_context(|| format!("creating {}", file.display()))?;
    let result = (|| -> anyhow::Result<RoundTrip> {
        pin_self(&[0])?;
        let run = |daemon_cpus: &[usize]| -> anyhow::Result<f64> {
            pin_process(pid, daemon_cpus)?;
            time_requests(&file, n / 10 + 1)?; // warm up on this placement
            let mut runs = Vec::with_capacity(repeat);
            for _ in 0..repeat.max(1) {
                runs.push(time_requests(&file, n)?);
            }
            Ok(median(runs))
        };
        Ok(RoundTrip {
            same_cpu: run(&[0])?,
            other_cpu: run(&[1])?,
            free: run(&cpus)?,
        })
    })();
    let restored = pin_process(pid, &cpus).and_then(|()| pin_self(&cpus));
    let removed =
        std::fs::remove_file(&file).with_context(|| format!("removing {}", file.display()));
    let rt = result?;
    restored?;
    removed?;
    Ok(rt)
}
