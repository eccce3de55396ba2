//! `tablix bench cluster`: tablix and rqlite clusters on loopback, in one
//! run. The seed's four batch workloads through each system's shell
//! against plain sqlite3 (`workloads.rs`); concurrent single-row inserts through the leader's HTTP API
//! (rate, p50, p99) on clusters of 1 and 3 nodes and on a plain daemon
//! (no cluster flags, its own log: what `tablix up` runs by default); a
//! source tree unpacked and removed on a 3-node cluster's mount (the
//! leader's and a follower's) against a plain daemon's and a 1-node
//! cluster's; and the time from SIGKILL of a 3-node cluster's leader to
//! the first write acknowledged by another node.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::{answer, load, workloads};
use crate::cli::ClusterBenchArgs;

/// A free loopback address (bound, then released).
fn free_addr() -> anyhow::Result<String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.to_string())
}

/// One server process of either system.
struct Server {
    child: Child,
    /// Its HTTP API, `host:port`.
    http: String,
    mount: Option<PathBuf>,
}

impl Server {
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM and wait: a clean stop, which unmounts (unless the
        // failover measurement killed it already).
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .arg(self.child.id().to_string())
                .status();
        }
        let _ = self.child.wait();
        // A node killed by the failover measurement leaves its mount.
        if let Some(m) = &self.mount {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(m)
                .stderr(Stdio::null())
                .status();
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum System {
    Tablix,
    Rqlite,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Tablix => "tablix",
            System::Rqlite => "rqlite",
        }
    }
}

/// A tablix node: `tablix up` as a node of a cluster, reporting its API
/// address on its ready line.
fn tablix_node(
    dir: &Path,
    id: u64,
    join: Option<&str>,
    raft: &str,
    mount: bool,
) -> anyhow::Result<Server> {
    let exe = std::env::current_exe()?;
    let data = dir.join(format!("tablix-{id}"));
    let mut cmd = Command::new(exe);
    cmd.args(["up", "--http", "127.0.0.1:0", "--node-id", &id.to_string()])
        .args(["--raft", raft])
        .arg("--data")
        .arg(&data);
    match join {
        Some(peer) => cmd.args(["--join", peer]),
        None => cmd.arg("--bootstrap"),
    };
    let mnt = dir.join(format!("mnt-{id}"));
    if mount {
        std::fs::create_dir_all(&mnt)?;
        cmd.arg(&mnt);
    }
    let (child, http) = super::daemon::spawn_ready(cmd.env("TABLIX_LOG", "error"))
        .with_context(|| format!("tablix node {id}"))?;
    Ok(Server {
        http,
        child,
        mount: mount.then_some(mnt),
    })
}

/// A plain daemon: `tablix up` without cluster flags, in a directory of
/// its own.
fn plain_daemon(dir: &Path, mount: bool) -> anyhow::Result<Server> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir)?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["up", "--http", "127.0.0.1:0", "--data"])
        .arg(dir.join("tablix"));
    let mnt = dir.join("mnt");
    if mount {
        std::fs::create_dir_all(&mnt)?;
        cmd.arg(&mnt);
    }
    let (child, http) = super::daemon::spawn_ready(cmd.env("TABLIX_LOG", "error"))
        .context("tablix plain daemon")?;
    Ok(Server {
        http,
        child,
        mount: mount.then_some(mnt),
    })
}

/// An rqlite node, ready once its `/readyz` answers 200.
fn rqlite_node(
    bin: &Path,
    dir: &Path,
    id: u64,
    join: Option<&str>,
    raft: &str,
) -> anyhow::Result<Server> {
    let http = free_addr()?;
    let mut cmd = Command::new(bin);
    cmd.args(["-node-id", &id.to_string(), "-http-addr", &http])
        .args(["-raft-addr", raft]);
    if let Some(peer) = join {
        cmd.args(["-join", peer]);
    }
    let child = cmd
        .arg(dir.join(format!("rqlite-{id}")))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let server = Server {
        child,
        http,
        mount: None,
    };
    let agent = ureq::Agent::new_with_defaults();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = agent
            .get(format!("http://{}/readyz", server.http))
            .call()
            .is_ok_and(|r| r.status() == 200);
        if ready {
            return Ok(server);
        }
        if Instant::now() > deadline {
            bail!("rqlite node {id} was not ready within 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A cluster of `n` nodes of `system`, the first one founding it.
fn cluster(
    system: System,
    a: &ClusterBenchArgs,
    dir: &Path,
    n: u64,
    mount: bool,
) -> anyhow::Result<Vec<Server>> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir)?;
    let mut nodes = Vec::new();
    let first_raft = free_addr()?;
    for id in 1..=n {
        let raft = if id == 1 {
            first_raft.clone()
        } else {
            free_addr()?
        };
        let join = (id > 1).then_some(first_raft.as_str());
        nodes.push(match system {
            System::Tablix => tablix_node(dir, id, join, &raft, mount)?,
            System::Rqlite => {
                let bin = a.rqlited.as_deref().context("no --rqlited")?;
                rqlite_node(bin, dir, id, join, &raft)?
            }
        });
    }
    // Every node sees every voter before the load starts.
    wait_for_voters(&nodes, n as usize)?;
    Ok(nodes)
}

fn get_json(agent: &ureq::Agent, url: &str) -> Option<serde_json::Value> {
    let mut r = agent.get(url).call().ok()?;
    serde_json::from_str(&r.body_mut().read_to_string().ok()?).ok()
}

/// rqlite's `/nodes?ver=2` as a node answers it.
fn nodes_seen(agent: &ureq::Agent, http: &str) -> Option<Vec<serde_json::Value>> {
    get_json(agent, &format!("http://{http}/nodes?ver=2"))?["nodes"]
        .as_array()
        .cloned()
}

fn wait_for_voters(nodes: &[Server], n: usize) -> anyhow::Result<()> {
    let agent = ureq::Agent::new_with_defaults();
    let deadline = Instant::now() + Duration::from_secs(60);
    for s in nodes {
        loop {
            let seen = nodes_seen(&agent, &s.http).unwrap_or_default();
            let ok = seen.len() == n
                && seen.iter().all(|v| v["reachable"] == true)
                && seen.iter().any(|v| v["leader"] == true);
            if ok {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "node at {} never saw {n} reachable voters and a leader",
                    s.http
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

/// The index among `nodes` of the leader, by its API address.
fn leader_of(nodes: &[Server], asked: &str) -> Option<usize> {
    let agent = ureq::Agent::new_with_defaults();
    let seen = nodes_seen(&agent, asked)?;
    let api = seen
        .iter()
        .find(|v| v["leader"] == true)?
        .get("api_addr")?
        .as_str()?
        .trim_start_matches("http://")
        .to_string();
    nodes.iter().position(|s| s.http == api)
}

/// The entry a node says it applied last (`/status`).
fn applied(agent: &ureq::Agent, http: &str) -> Option<u64> {
    let text = agent
        .get(format!("http://{http}/status"))
        .call()
        .and_then(|mut r| r.body_mut().read_to_string())
        .ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["store"]["raft"]["applied_index"].as_u64()
}

/// Waits until the node at `http` applied what the leader at `leader`
/// had applied when asked.
fn caught_up(leader: &str, http: &str) -> anyhow::Result<()> {
    let agent = ureq::Agent::new_with_defaults();
    let target = applied(&agent, leader).context("the leader's status")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while applied(&agent, http).is_none_or(|a| a < target) {
        if Instant::now() > deadline {
            bail!("node {http} did not apply entry {target} within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn post(agent: &ureq::Agent, url: &str, body: String) -> Option<String> {
    agent
        .post(url)
        .header("Content-Type", "application/json")
        .send(body)
        .and_then(|mut r| r.body_mut().read_to_string())
        .ok()
}

/// Rate and latencies of `clients` threads each posting one single-row
/// INSERT at a time to `http`, for `seconds`.
struct Load {
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn inserts(http: &str, clients: usize, seconds: f64) -> anyhow::Result<Load> {
    let seen = load::post_for(
        http,
        "/db/execute",
        clients,
        seconds,
        |c, i| {
            format!(
                r#"[["INSERT INTO bench(v) VALUES (?)", {}]]"#,
                (c as u64) << 40 | i
            )
        },
        answer::one_row_inserted,
    )?;
    if seen.failed > 0 {
        bail!("{} inserts failed", seen.failed);
    }
    let mut all = seen.took;
    all.sort_by(f64::total_cmp);
    let at = |q: f64| {
        all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
            .map_or(f64::NAN, |s| s * 1000.0)
    };
    Ok(Load {
        rate: all.len() as f64 / seen.elapsed,
        p50_ms: at(0.50),
        p99_ms: at(0.99),
    })
}

/// Writes back what the previous run left dirty and lets the machine
/// quiet down, so that no run pays for the one before it (the kernel's
/// writeback of another system's data would fall into it).
fn settle() {
    nix::unistd::sync();
    std::thread::sleep(Duration::from_secs(1));
}

/// The round whose rate is the median (the lower middle one of an even
/// count), with its own latencies.
fn median_load(mut rounds: Vec<Load>) -> Option<Load> {
    rounds.sort_by(|x, y| x.rate.total_cmp(&y.rate));
    let middle = rounds.len().checked_sub(1)? / 2;
    Some(rounds.swap_remove(middle))
}

fn create_table(http: &str) -> anyhow::Result<()> {
    execute(
        http,
        "CREATE TABLE bench(id INTEGER PRIMARY KEY, v INTEGER)",
    )
}

/// Runs one statement through `/db/execute` and checks it succeeded.
fn execute(http: &str, statement: &str) -> anyhow::Result<()> {
    let agent = ureq::Agent::new_with_defaults();
    let body = serde_json::to_string(&[statement])?;
    let text = post(&agent, &format!("http://{http}/db/execute"), body)
        .with_context(|| format!("no answer to {statement}"))?;
    if !answer::succeeded(&text) {
        bail!("{statement}: {text}");
    }
    Ok(())
}

/// Seconds from SIGKILL of the leader to the first insert another node
/// acknowledges.
fn failover(nodes: &mut [Server]) -> anyhow::Result<f64> {
    let leader = leader_of(nodes, &nodes[0].http).context("no leader to kill")?;
    let other = (leader + 1) % nodes.len();
    let url = format!("http://{}/db/execute", nodes[other].http);
    nodes[leader].kill();
    let killed = Instant::now();
    let agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .new_agent();
    while killed.elapsed() < Duration::from_secs(60) {
        let ok = post(
            &agent,
            &url,
            r#"[["INSERT INTO bench(v) VALUES (?)", -1]]"#.into(),
        )
        .is_some_and(|t| answer::one_row_inserted(&t));
        if ok {
            return Ok(killed.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    bail!("no write was acknowledged within 60 s of killing the leader")
}

/// Seconds to unpack `tar` under `at` and to remove it again.
fn tree(at: &Path, tar: &Path) -> anyhow::Result<(f64, f64)> {
    let dest = at.join("tree");
    std::fs::create_dir_all(&dest)?;
    let t = Instant::now();
    let untar = Command::new("tar")
        .arg("-xf")
        .arg(tar)
        .arg("-C")
        .arg(&dest)
        .status()?;
    let unpacked = t.elapsed().as_secs_f64();
    if !untar.success() {
        bail!("tar -x on {} failed", at.display());
    }
    let t = Instant::now();
    let rm = Command::new("rm").arg("-rf").arg(&dest).status()?;
    if !rm.success() {
        bail!("rm -rf on {} failed", at.display());
    }
    Ok((unpacked, t.elapsed().as_secs_f64()))
}

pub fn run(a: ClusterBenchArgs) -> anyhow::Result<ExitCode> {
    if a.clients.is_empty() || a.clients.contains(&0) {
        bail!("--clients must name positive numbers");
    }
    if let Some(bin) = &a.rqlited
        && !bin.exists()
    {
        bail!("--rqlited {} does not exist", bin.display());
    }
    let dir = a
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/bench/cluster"));
    std::fs::create_dir_all(&dir)?;
    let dir = dir.canonicalize()?;
    let mut systems = vec![System::Tablix];
    if a.rqlited.is_some() {
        systems.push(System::Rqlite);
    } else {
        eprintln!("no --rqlited: measuring tablix alone");
    }

    // The seed's batch workloads: plain sqlite3 first, then each system
    // on each cluster below. (label, seconds per workload)
    let workloads = workloads::all(a.workload_scale);
    let scripts = workloads::write_scripts(&dir.join("workloads"), &workloads)?;
    let run_batches = a.workload_scale > 0.0;
    let mut batches: Vec<(String, Vec<f64>)> = Vec::new();
    let rqlite_cli = a
        .rqlite
        .clone()
        .or_else(|| a.rqlited.as_ref().map(|d| d.with_file_name("rqlite")));
    if run_batches {
        eprintln!("the seed's batch workloads on plain sqlite3");
        let mut times = Vec::new();
        for (w, script) in workloads.iter().zip(&scripts) {
            times.push(workloads::sqlite3(&dir, w, script)?);
        }
        batches.push(("sqlite3".into(), times));
    }

    // Inserts: (system, nodes) -> one Load per client count; 0 nodes is
    // tablix's plain daemon, measured beside the clusters of one. Both
    // systems' clusters of a size run side by side and take turns in each
    // round, so that a drift of the machine's speed during the run falls
    // on both.
    let mut loads: Vec<(System, u64, Vec<Load>)> = Vec::new();
    let mut failovers: Vec<(System, f64)> = Vec::new();
    for n in [1u64, 3] {
        // Every system's cluster is up before any is measured, so each
        // runs beside the same idle neighbours.
        let mut clusters = Vec::new();
        if n == 1 {
            eprintln!("starting tablix's plain daemon");
            let plain = plain_daemon(&dir.join("tablix-plain"), false)?;
            let http = plain.http.clone();
            clusters.push((System::Tablix, 0, vec![plain], http));
        }
        for &system in &systems {
            eprintln!("starting {} with {n} node(s)", system.name());
            let nodes = cluster(system, &a, &dir.join(system.name()), n, false)?;
            let leader = leader_of(&nodes, &nodes[0].http).context("no leader")?;
            let http = nodes[leader].http.clone();
            clusters.push((system, n, nodes, http));
        }
        for (system, n, _, http) in &clusters {
            let (system, n, http) = (*system, *n, http.as_str());
            eprintln!("measuring {}", shape(system, n));
            if run_batches {
                let mut times = Vec::new();
                for (w, script) in workloads.iter().zip(&scripts) {
                    for statement in w.setup() {
                        execute(http, &statement)?;
                    }
                    times.push(match system {
                        System::Tablix => workloads::tablix(http, script)?,
                        System::Rqlite => {
                            let cli = rqlite_cli.as_deref().context("no rqlite shell")?;
                            workloads::rqlite(cli, http, script)?
                        }
                    });
                }
                batches.push((shape(system, n), times));
            }
            create_table(http)?;
        }
        let mut per: Vec<Vec<Load>> = clusters.iter().map(|_| Vec::new()).collect();
        for &c in &a.clients {
            let mut rounds: Vec<Vec<Load>> = clusters.iter().map(|_| Vec::new()).collect();
            for _ in 0..a.repeat {
                for (k, (_, _, _, http)) in clusters.iter().enumerate() {
                    settle();
                    rounds[k].push(inserts(http, c, a.seconds)?);
                }
            }
            for (k, r) in rounds.into_iter().enumerate() {
                per[k].push(median_load(r).context("no insert round ran")?);
            }
        }
        for ((system, n, mut nodes, _), per) in clusters.into_iter().zip(per) {
            loads.push((system, n, per));
            if n == 3 {
                failovers.push((system, failover(&mut nodes)?));
            }
        }
    }

    let mut trees: Vec<(String, (f64, f64))> = Vec::new();
    if a.tree_files > 0 {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("not root: the mount workload is skipped");
        } else {
            let tar = super::fs::source_tree(&dir, a.tree_files)?;
            eprintln!("unpacking a tree on a plain daemon's mount");
            let plain = plain_daemon(&dir.join("tablix-plain-mount"), true)?;
            let m = plain.mount.as_deref().context("no mount")?;
            trees.push(("plain daemon's mount".into(), tree(m, &tar)?));
            drop(plain);
            for n in [1u64, 3] {
                eprintln!("unpacking a tree on a {n}-node cluster's mounts");
                let nodes = cluster(System::Tablix, &a, &dir.join("tablix-mount"), n, true)?;
                let leader = leader_of(&nodes, &nodes[0].http).context("no leader")?;
                for (i, s) in nodes.iter().enumerate() {
                    if n == 3 && i != leader && i != (leader + 1) % 3 {
                        continue;
                    }
                    let role = if i == leader { "leader" } else { "follower" };
                    let m = s.mount.as_deref().context("no mount")?;
                    // The mounts read at level none: a follower still
                    // applying the last run's removal would show its tree.
                    caught_up(&nodes[leader].http, &s.http)?;
                    trees.push((format!("{n} node(s), {role}'s mount"), tree(m, &tar)?));
                }
            }
        }
    }

    if !batches.is_empty() {
        println!(
            "the seed's batch workloads through each shell's batch mode (sqlite3 and rqlite one statement at a time, tablix with consecutive writes and queries in groups), seconds (ratio to sqlite3)"
        );
        print!("{:<22}", "system");
        for w in &workloads {
            print!(" {:>22}", format!("{} ({})", w.name, w.statements));
        }
        println!();
        let base = batches[0].1.clone();
        for (label, times) in &batches {
            print!("{label:<22}");
            for (t, b) in times.iter().zip(&base) {
                print!(" {:>22}", format!("{t:.2} ({:.2})", t / b));
            }
            println!();
        }
        println!();
    }
    println!(
        "concurrent single-row inserts through the leader's /db/execute, {} s per run, the median of {} round(s), on {}",
        a.seconds,
        a.repeat,
        dir.display()
    );
    println!(
        "{:<22} {:>8} {:>12} {:>9} {:>9} {:>16}",
        "cluster", "clients", "inserts/s", "p50 ms", "p99 ms", "tablix/rqlite"
    );
    for (system, n, per) in &loads {
        for (i, c) in a.clients.iter().enumerate() {
            let l = &per[i];
            let ratio = if *system == System::Tablix {
                loads
                    .iter()
                    .find(|(s, m, _)| *s == System::Rqlite && *m == (*n).max(1))
                    .map(|(_, _, r)| format!("{:.2}", l.rate / r[i].rate))
                    .unwrap_or_else(|| "-".into())
            } else {
                String::new()
            };
            println!(
                "{:<22} {:>8} {:>12.0} {:>9.2} {:>9.2} {:>16}",
                shape(*system, *n),
                c,
                l.rate,
                l.p50_ms,
                l.p99_ms,
                ratio
            );
        }
    }
    println!();
    println!(
        "failover: SIGKILL of a 3-node cluster's leader to the first insert another node acknowledges"
    );
    for (system, s) in &failovers {
        println!("{:<22} {:>8.2} s", system.name(), s);
    }
    if !trees.is_empty() {
        println!();
        println!(
            "a source tree of {} files unpacked (tar -x) and removed (rm -rf) on the mount, seconds (against the plain daemon, against 1 node)",
            a.tree_files
        );
        let plain = trees[0].1;
        let one = trees.get(1).map_or(plain, |t| t.1);
        for (label, (x, rm)) in &trees {
            println!(
                "{label:<34} untar {x:>7.2} ({:.2}, {:.2})   rm -rf {rm:>7.2} ({:.2}, {:.2})",
                x / plain.0,
                x / one.0,
                rm / plain.1,
                rm / one.1
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How a row names a system's cluster; 0 nodes is tablix's plain daemon.
fn shape(system: System, n: u64) -> String {
    match n {
        0 => format!("{} plain daemon", system.name()),
        n => format!("{} {n} node(s)", system.name()),
    }
}

#[cfg(test)]
mod tests {
    use super::{Load, median_load};

    fn load(rate: f64, p50_ms: f64) -> Load {
        Load {
            rate,
            p50_ms,
            p99_ms: p50_ms * 2.0,
        }
    }

    #[test]
    fn the_median_round_is_reported_with_its_own_latencies() {
        let m = median_load(vec![load(300.0, 3.0), load(100.0, 1.0), load(200.0, 2.0)])
            .expect("three rounds");
        assert_eq!((m.rate, m.p50_ms, m.p99_ms), (200.0, 2.0, 4.0));
        let even = median_load(vec![
            load(40.0, 4.0),
            load(10.0, 1.0),
            load(30.0, 3.0),
            load(20.0, 2.0),
        ])
        .expect("four rounds");
        assert_eq!(even.rate, 20.0, "the lower middle of an even count");
        assert!(median_load(Vec::new()).is_none());
    }
}
