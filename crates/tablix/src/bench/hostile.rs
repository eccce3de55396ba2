//! `tablix bench hostile`: what hostile SQL clients cost everyone else.
//!
//! On a daemon with a mount, the latency of `stat` and of a small read on
//! the mount (each reaching the daemon: every file is stat'ed once, after
//! the kernel's cached entry for it has expired, and read with O_DIRECT)
//! is measured idle, then again while four
//! clients run queries that never end on their own and one runs a write
//! that never ends, each sent again as soon as its time limit stops it,
//! next to two ordinary clients inserting and counting rows. The daemon's
//! resident memory is sampled throughout. Ratios are hostile over idle, in
//! one run.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::bench::answer;
use crate::bench::daemon::Daemon;
use crate::cli::HostileBenchArgs;

const RUNAWAY_READ: &str =
    r#"["WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c"]"#;
const RUNAWAY_WRITE: &str = r#"["INSERT INTO sink WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT x FROM c"]"#;

/// Bytes of each file read.
const BLOCK: usize = 4096;

pub fn run(args: HostileBenchArgs) -> anyhow::Result<std::process::ExitCode> {
    if !nix::unistd::geteuid().is_root() {
        bail!("bench hostile mounts a file system: run it as root");
    }
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/bench/hostile"));
    println!(
        "tablix bench hostile: {} files per phase, 4 runaway queries + 1 runaway write + 2 ordinary clients, memory limit {} MiB",
        args.files,
        args.memory_limit >> 20
    );
    for mode in &args.modes {
        run_mode(&args, &dir, mode)?;
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Latencies of one kind of operation, microseconds.
struct Lat(Vec<f64>);

impl Lat {
    fn pct(&self, p: f64) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return f64::NAN;
        }
        v[((v.len() - 1) as f64 * p).round() as usize]
    }
}

/// Longer than the kernel's entry and attribute cache time on the mount.
const CACHE_EXPIRY: Duration = Duration::from_secs(11);

/// stat then an O_DIRECT read of every file, each reaching the daemon:
/// the files were last touched longer ago than the kernel caches them.
fn measure(files: &[PathBuf]) -> anyhow::Result<(Lat, Lat)> {
    let mut stat = Vec::with_capacity(files.len());
    for f in files {
        let t = Instant::now();
        let m = std::fs::metadata(f)?;
        stat.push(t.elapsed().as_secs_f64() * 1e6);
        if m.len() != BLOCK as u64 {
            bail!("{} has {} bytes", f.display(), m.len());
        }
    }
    let mut read = Vec::with_capacity(files.len());
    let mut buf = AlignedBuf::new();
    for f in files {
        let t = Instant::now();
        let mut file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(f)?;
        let n = file.read(buf.get())?;
        read.push(t.elapsed().as_secs_f64() * 1e6);
        if n != BLOCK {
            bail!("read {n} bytes of {}", f.display());
        }
    }
    Ok((Lat(stat), Lat(read)))
}

/// A 4 KiB buffer aligned for O_DIRECT, inside a larger allocation.
struct AlignedBuf(Vec<u8>);

impl AlignedBuf {
    fn new() -> AlignedBuf {
        AlignedBuf(vec![0u8; 2 * BLOCK])
    }

    fn get(&mut self) -> &mut [u8] {
        let off = self.0.as_ptr().align_offset(BLOCK);
        &mut self.0[off..off + BLOCK]
    }
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Sends one request; whether it was answered with results and no error.
fn post(agent: &ureq::Agent, http: &str, path: &str, body: &str) -> bool {
    agent
        .post(format!("http://{http}{path}"))
        .header("Content-Type", "application/json")
        .send(body)
        .and_then(|mut r| r.body_mut().read_to_string())
        .is_ok_and(|text| answer::succeeded(&text))
}

/// Two ordinary clients, an insert and a count, over and over for
/// `seconds`: their requests per second.
fn ordinary(http: &str, seconds: u64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let threads: Vec<_> = (0..2)
        .map(|i| {
            let (http, stop, ops) = (http.to_string(), Arc::clone(&stop), Arc::clone(&ops));
            std::thread::spawn(move || {
                let agent = ureq::Agent::new_with_defaults();
                while !stop.load(Ordering::Relaxed) {
                    let ok = if i == 0 {
                        post(
                            &agent,
                            &http,
                            "/db/execute",
                            r#"["INSERT INTO ordinary(x) VALUES (random())"]"#,
                        )
                    } else {
                        post(
                            &agent,
                            &http,
                            "/db/query",
                            r#"["SELECT count(*) FROM ordinary"]"#,
                        )
                    };
                    if ok {
                        ops.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds));
    let rate = ops.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    rate
}

fn run_mode(args: &HostileBenchArgs, dir: &Path, mode: &str) -> anyhow::Result<()> {
    let data = dir.join(format!("data-{mode}"));
    let mnt = dir.join(format!("mnt-{mode}"));
    let d = Daemon::start(
        &data,
        &mnt,
        mode,
        &[
            "--readers".into(),
            "6".into(),
            "--memory-limit".into(),
            args.memory_limit.to_string(),
            "--statement-timeout".into(),
            "30s".into(),
            "--write-timeout".into(),
            "5s".into(),
        ],
    )?;
    let agent = ureq::Agent::new_with_defaults();
    if !post(
        &agent,
        &d.http,
        "/db/execute",
        r#"["CREATE TABLE sink(x)", "CREATE TABLE ordinary(id INTEGER PRIMARY KEY, x)"]"#,
    ) {
        bail!("creating the tables failed");
    }
    let mut sets = Vec::new();
    for set in ["idle", "hostile"] {
        let sub = d.mount.join(set);
        std::fs::create_dir_all(&sub)?;
        let files: Vec<PathBuf> = (0..args.files).map(|i| sub.join(format!("f{i}"))).collect();
        for f in &files {
            std::fs::write(f, vec![7u8; BLOCK])?;
        }
        sets.push(files);
    }
    let pid = d.pid();
    std::thread::sleep(CACHE_EXPIRY);
    let (idle_stat, idle_read) = measure(&sets[0])?;
    let idle_ops = ordinary(&d.http, args.seconds);
    // The hostile clients, each sending its statement again whenever its
    // time limit ends it.
    let hostile_stop = Arc::new(AtomicBool::new(false));
    let mut hostile = Vec::new();
    for i in 0..5 {
        let (http, stop) = (d.http.clone(), Arc::clone(&hostile_stop));
        hostile.push(std::thread::spawn(move || {
            let agent = ureq::Agent::new_with_defaults();
            let (path, body) = if i < 4 {
                ("/db/query", RUNAWAY_READ)
            } else {
                ("/db/execute", RUNAWAY_WRITE)
            };
            while !stop.load(Ordering::Relaxed) {
                post(&agent, &http, path, body);
            }
        }));
    }
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (peak, stop) = (Arc::clone(&peak), Arc::clone(&hostile_stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid, "VmRSS:"), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    let (host_stat, host_read) = measure(&sets[1])?;
    let host_ops = ordinary(&d.http, args.seconds);
    let status: serde_json::Value = agent
        .get(format!("http://{}/status", d.http))
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_to_string().ok())
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    hostile_stop.store(true, Ordering::Relaxed);
    let hwm = rss_kib(pid, "VmHWM:");
    // Stopping the daemon interrupts the runaway statements.
    d.stop()?;
    for t in hostile {
        let _ = t.join();
    }
    let _ = sampler.join();
    let stats = &status["store"]["stats"];
    println!("{mode} mode:");
    for (what, idle, host) in [
        ("stat", &idle_stat, &host_stat),
        ("4 KiB O_DIRECT read", &idle_read, &host_read),
    ] {
        println!(
            "  {what:<20} median {:>7.1} us idle, {:>7.1} us hostile: ratio {:.2}; p99 {:>8.1} us idle, {:>8.1} us hostile",
            idle.pct(0.5),
            host.pct(0.5),
            host.pct(0.5) / idle.pct(0.5),
            idle.pct(0.99),
            host.pct(0.99)
        );
    }
    println!(
        "  ordinary clients: {idle_ops:.0} requests/s idle, {host_ops:.0} hostile: ratio {:.2}",
        host_ops / idle_ops
    );
    println!(
        "  statements stopped by their time limit: {}; SQLite heap peak {} MiB",
        stats["statements_timed_out"],
        stats["sqlite_heap_peak_bytes"].as_i64().unwrap_or(0) >> 20
    );
    println!(
        "  daemon resident memory: peak sampled {} MiB, high-water mark {} MiB, against a memory limit of {} MiB",
        peak.load(Ordering::Relaxed) >> 10,
        hwm >> 10,
        args.memory_limit >> 20
    );
    Ok(())
}
