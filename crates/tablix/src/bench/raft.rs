//! `tablix bench raft`: what running the write path as a cluster of one
//! under openraft (`tablix_raft::SingleNode`: openraft's log storage on
//! the command log, its state machine on the store) costs against the
//! store's own command log, in one process, with no HTTP in between.
//! Each client proposes single-row inserts one after another; both paths
//! log each Command durably before it is applied and answered. Besides the
//! rate, each run reports the process's CPU time per insert (clients
//! included, the same on both paths): what a path costs the machine,
//! apart from the time it waits.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use tablix_raft::SingleNode;
use tablix_store::{
    CommandReply, LogKeeper, Params, Principal, ReplicatedCommand, SqlCommand, Stamp, Stamped,
    Statement, Store, StoreConfig, Value,
};

use super::median;
use crate::cli::RaftBenchArgs;

#[derive(Clone, Copy, PartialEq)]
enum Route {
    Own,
    Raft,
}

impl Route {
    fn name(self) -> &'static str {
        match self {
            Route::Own => "store's own log",
            Route::Raft => "cluster of one (openraft)",
        }
    }
}

fn insert(n: u64) -> SqlCommand {
    SqlCommand {
        statements: vec![Statement::with_params(
            "INSERT INTO bench(v) VALUES (?1)",
            Params::Positional(vec![Value::Integer(n as i64)]),
        )],
        transaction: false,
        principal: Principal::root(),
    }
}

fn create() -> SqlCommand {
    SqlCommand {
        statements: vec![Statement::new(
            "CREATE TABLE bench(id INTEGER PRIMARY KEY, v INTEGER)",
        )],
        transaction: false,
        principal: Principal::root(),
    }
}

/// One proposer of either path.
#[derive(Clone)]
enum Proposer {
    Own(Arc<Store>),
    Raft(Arc<SingleNode>),
}

impl Proposer {
    async fn propose(&self, command: SqlCommand) -> anyhow::Result<()> {
        let stamped = Stamped::new(Stamp::now(), command);
        match self {
            Proposer::Own(store) => {
                store
                    .submit_sql(stamped, store.config().write_limits())
                    .await?;
            }
            Proposer::Raft(node) => {
                let reply = node
                    .propose(Stamped::new(
                        stamped.stamp,
                        ReplicatedCommand::Sql(stamped.command),
                    ))
                    .await?;
                if let CommandReply::Failed(e) = reply {
                    anyhow::bail!("an insert failed: {e}");
                }
            }
        }
        Ok(())
    }
}

/// What one run measured.
struct Run {
    /// Inserts per second.
    rate: f64,
    /// The process's CPU time per insert, in microseconds.
    cpu_us: f64,
}

/// The CPU time this process has used, all threads.
fn process_cpu() -> anyhow::Result<Duration> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .context("reading the process's CPU time")?;
    Ok(Duration::new(
        u64::try_from(t.tv_sec()).unwrap_or(0),
        u32::try_from(t.tv_nsec()).unwrap_or(0),
    ))
}

/// Inserts per second from `clients` concurrent proposers on `path`,
/// in a fresh directory `dir`, and their CPU time.
async fn measure(path: Route, dir: &Path, clients: usize, seconds: f64) -> anyhow::Result<Run> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    let mut config = StoreConfig::new(dir.join("data"));
    if path == Route::Raft {
        config.log_keeper = LogKeeper::Replication;
    }
    let store = Arc::new(Store::open(config)?);
    let (proposer, node) = match path {
        Route::Own => (Proposer::Own(Arc::clone(&store)), None),
        Route::Raft => {
            let node = Arc::new(
                SingleNode::start(
                    &dir.join("raft-log"),
                    &dir.join("snapshots"),
                    Arc::clone(&store),
                )
                .await?,
            );
            (Proposer::Raft(Arc::clone(&node)), Some(node))
        }
    };
    proposer.propose(create()).await?;
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let cpu_before = process_cpu()?;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let proposer = proposer.clone();
        let done = Arc::clone(&done);
        tasks.push(tokio::spawn(async move {
            let mut n = (c as u64) << 32;
            while Instant::now() < deadline {
                proposer.propose(insert(n)).await?;
                n += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let inserts = done.load(Ordering::Relaxed) as f64;
    let rate = inserts / started.elapsed().as_secs_f64();
    let cpu = process_cpu()?.saturating_sub(cpu_before);
    let cpu_us = cpu.as_secs_f64() * 1e6 / inserts.max(1.0);
    drop(proposer);
    if let Some(node) = node {
        match Arc::try_unwrap(node) {
            Ok(node) => node.shutdown().await?,
            Err(_) => anyhow::bail!("a client still holds the cluster of one"),
        }
    }
    store.close()?;
    Ok(Run { rate, cpu_us })
}

pub fn run(a: RaftBenchArgs) -> anyhow::Result<ExitCode> {
    let dir = a
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/bench/raft"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut runs: Vec<(usize, Route, Vec<Run>)> = Vec::new();
    for &clients in &a.clients {
        for path in [Route::Own, Route::Raft] {
            runs.push((clients, path, Vec::new()));
        }
    }
    for round in 0..a.repeat {
        for &clients in &a.clients {
            let order = if round % 2 == 0 {
                [Route::Own, Route::Raft]
            } else {
                [Route::Raft, Route::Own]
            };
            for path in order {
                let run = rt.block_on(measure(path, &dir.join("run"), clients, a.seconds))?;
                eprintln!(
                    "round {}/{}: {clients} client(s), {}: {:.0} inserts/s, {:.1} us of CPU each",
                    round + 1,
                    a.repeat,
                    path.name(),
                    run.rate,
                    run.cpu_us
                );
                if let Some(r) = runs
                    .iter_mut()
                    .find(|(c, p, _)| *c == clients && *p == path)
                {
                    r.2.push(run);
                }
            }
        }
    }
    println!(
        "single-row inserts, sync mode, in one process, {} s per run, median of {} rounds (alternating which path runs first), on {}",
        a.seconds,
        a.repeat,
        dir.display()
    );
    println!(
        "{:>8}  {:>16}  {:>26}  {:>6}  {:>14}  {:>14}",
        "clients",
        "store's own log",
        "cluster of one (openraft)",
        "ratio",
        "CPU us, own",
        "CPU us, raft"
    );
    for &clients in &a.clients {
        let of = |path: Route, field: fn(&Run) -> f64| {
            runs.iter()
                .find(|(c, p, _)| *c == clients && *p == path)
                .map_or(f64::NAN, |(_, _, v)| median(v.iter().map(field).collect()))
        };
        let (own, raft) = (of(Route::Own, |r| r.rate), of(Route::Raft, |r| r.rate));
        let (own_cpu, raft_cpu) = (of(Route::Own, |r| r.cpu_us), of(Route::Raft, |r| r.cpu_us));
        println!(
            "{clients:>8}  {own:>16.0}  {raft:>26.0}  {:>6.2}  {own_cpu:>14.1}  {raft_cpu:>14.1}",
            raft / own
        );
    }
    println!("(CPU us: the process's CPU time per insert, clients included; medians)");
    Ok(ExitCode::SUCCESS)
}
