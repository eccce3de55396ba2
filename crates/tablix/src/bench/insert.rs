//! Single-row inserts through the HTTP API against plain rusqlite.

use std::path::{Path, PathBuf};
use std::process::{Child, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rusqlite::Connection;

use super::{answer, median};
use crate::cli::InsertBenchArgs;

/// Plain rusqlite, one INSERT per transaction, synchronous=FULL, WAL (the
/// journal mode tablix uses), on `dir`.
fn baseline(dir: &Path, seconds: f64) -> anyhow::Result<f64> {
    let path = dir.join("baseline.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let conn = Connection::open(&path)?;
    conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch("CREATE TABLE bench(id INTEGER PRIMARY KEY, v INTEGER)")?;
    let mut stmt = conn.prepare("INSERT INTO bench(v) VALUES (?1)")?;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut n = 0u64;
    while Instant::now() < deadline {
        stmt.execute([n as i64])?;
        n += 1;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

struct Daemon {
    child: Child,
    addr: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SIGTERM, then wait: the daemon shuts down cleanly.
        let _ = std::process::Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

fn start_daemon(data: &Path) -> anyhow::Result<Daemon> {
    let exe = std::env::current_exe()?;
    let (child, addr) = super::daemon::spawn_ready(
        std::process::Command::new(exe)
            .args(["up", "--mode", "sync", "--http", "127.0.0.1:0", "--data"])
            .arg(data)
            .env("TABLIX_LOG", "warn")
            .stderr(Stdio::inherit()),
    )?;
    Ok(Daemon { addr, child })
}

/// `clients` threads, each posting one single-row INSERT at a time.
fn through_http(addr: &str, clients: usize, seconds: f64) -> anyhow::Result<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let url = format!("http://{addr}/db/execute");
    let mut threads = Vec::new();
    let started = Instant::now();
    for c in 0..clients {
        let (stop, done, failed, url) = (stop.clone(), done.clone(), failed.clone(), url.clone());
        threads.push(std::thread::spawn(move || {
            let agent = ureq::Agent::new_with_defaults();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let body = format!(
                    r#"[["INSERT INTO bench(v) VALUES (?)", {}]]"#,
                    (c as u64) << 40 | i
                );
                // The body is read whole, as a client must to reuse its
                // connection, and checked: an answer that reports an error
                // is a failure, not an insert.
                let inserted = agent
                    .post(&url)
                    .header("Content-Type", "application/json")
                    .send(body)
                    .and_then(|mut r| r.body_mut().read_to_string())
                    .is_ok_and(|text| answer::one_row_inserted(&text));
                if inserted {
                    done.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
            }
        }));
    }
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let elapsed = started.elapsed().as_secs_f64();
    if failed.load(Ordering::Relaxed) > 0 {
        bail!("{} requests failed", failed.load(Ordering::Relaxed));
    }
    Ok(done.load(Ordering::Relaxed) as f64 / elapsed)
}

pub fn run(a: InsertBenchArgs) -> anyhow::Result<ExitCode> {
    if a.repeat == 0 || a.clients.is_empty() || a.clients.contains(&0) || a.seconds <= 0.0 {
        bail!("--repeat, --clients and --seconds must be positive");
    }
    let dir: PathBuf = a
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/bench"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let data = dir.join("tablix-data");
    let _ = std::fs::remove_dir_all(&data);
    let daemon = start_daemon(&data)?;
    let setup = ureq::Agent::new_with_defaults();
    setup
        .post(format!("http://{}/db/execute", daemon.addr))
        .header("Content-Type", "application/json")
        .send(r#"["CREATE TABLE bench(id INTEGER PRIMARY KEY, v INTEGER)"]"#)
        .context("creating the bench table")?;

    let mut base = Vec::new();
    let mut ours: Vec<Vec<f64>> = vec![Vec::new(); a.clients.len()];
    for round in 0..a.repeat {
        base.push(baseline(&dir, a.seconds)?);
        for (i, &c) in a.clients.iter().enumerate() {
            ours[i].push(through_http(&daemon.addr, c, a.seconds)?);
        }
        eprintln!("round {}/{} done", round + 1, a.repeat);
    }
    drop(daemon);
    let b = median(base);
    println!(
        "single-row inserts, sync mode, {} s per run, median of {} rounds, on {}",
        a.seconds,
        a.repeat,
        dir.display()
    );
    println!("{:<44} {:>12} {:>8}", "configuration", "rows/s", "ratio");
    println!(
        "{:<44} {:>12.0} {:>8.2}",
        "rusqlite, 1 insert/txn, synchronous=FULL, WAL", b, 1.0
    );
    for (i, &c) in a.clients.iter().enumerate() {
        let m = median(ours[i].clone());
        println!(
            "{:<44} {:>12.0} {:>8.2}",
            format!("tablix HTTP /db/execute, {c} client(s)"),
            m,
            m / b
        );
    }
    Ok(ExitCode::SUCCESS)
}
